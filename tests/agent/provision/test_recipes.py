"""Which engines the agent can install: those whose engine module carries a recipe."""

from __future__ import annotations

from llmgw.agent.provision.recipes import RECIPES, cannot_install
from llmgw.engines.llamacpp import LlamaCppEngine
from llmgw.engines.vllm import VllmEngine


def test_llamacpp_and_vllm_have_recipes_and_sglang_says_how_to_run_it_anyway() -> None:
    assert set(RECIPES) == {"llamacpp", "vllm"}
    assert RECIPES["llamacpp"] is LlamaCppEngine.recipe
    assert RECIPES["vllm"] is VllmEngine.recipe
    assert cannot_install("sglang") == (
        "this agent does not know how to install sglang; "
        "install it by hand and name it in the agent's configuration"
    )
