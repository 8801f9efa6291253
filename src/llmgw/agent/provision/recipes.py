"""Which engines this agent can install: those whose module carries a recipe.

A recipe (engines/base.py's Recipe) lives with its engine, in its module:
llama.cpp's says where its builds are published and which one a machine
gets; vLLM's (a WheelRecipe) which lock of pinned wheels a machine gets,
installed with pip into an environment of its own (wheels.py). SGLang has
none yet: it is installed by hand and named in agent.yaml.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from llmgw.engines.base import Recipe, WheelRecipe
from llmgw.engines.registry import ENGINES

RECIPES: Mapping[str, Recipe | WheelRecipe] = MappingProxyType(
    {name: engine.recipe for name, engine in ENGINES.items() if engine.recipe is not None}
)


def cannot_install(engine: str) -> str:
    return (
        f"this agent does not know how to install {engine}; "
        "install it by hand and name it in the agent's configuration"
    )
