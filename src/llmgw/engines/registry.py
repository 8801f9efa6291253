"""The engines this llmgw knows, by the name the catalog, StartShard and agent.yaml use."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from llmgw.engines.base import Engine
from llmgw.engines.llamacpp import LlamaCppEngine
from llmgw.engines.sglang import SglangEngine
from llmgw.engines.sim import SimEngine
from llmgw.engines.vllm import VllmEngine
from llmgw.errors import LlmgwError

# One line per engine kind, by the name the catalog, StartShard and agent.yaml's engines: use; the
# rest of the engine is its module. tests/agent/test_new_engine.py adds one line here and no more.
_KINDS: dict[str, Engine] = {
    "sim": SimEngine(),
    "llamacpp": LlamaCppEngine(),
    "vllm": VllmEngine(),
    "sglang": SglangEngine(),
}

ENGINES: Mapping[str, Engine] = MappingProxyType(_KINDS)


def get_engine(name: str) -> Engine:
    """The adapter for name; a LlmgwError naming the known engines when there is none."""
    try:
        return ENGINES[name]
    except KeyError:
        known = ", ".join(sorted(ENGINES))
        raise LlmgwError(f"there is no engine called {name!r} (known engines: {known})") from None
