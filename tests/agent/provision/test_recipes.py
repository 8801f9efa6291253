"""Which engines the agent can install: those whose engine module carries a recipe."""

from __future__ import annotations

from llmgw.agent.provision.recipes import RECIPES, cannot_install
from llmgw.engines.llamacpp import LlamaCppEngine


def test_vllm_and_sglang_have_no_recipe_and_say_how_to_run_them_anyway() -> None:
    assert set(RECIPES) == {"llamacpp"}
    assert RECIPES["llamacpp"] is LlamaCppEngine.recipe
    assert cannot_install("sglang") == (
        "this agent does not know how to install sglang; "
        "install it by hand and name it in the agent's configuration"
    )
