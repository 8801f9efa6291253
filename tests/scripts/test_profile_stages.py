"""scripts/profile_stages.py gives each of py-spy's samples to the stage of the request path it was in.

Recording needs py-spy and a gateway under load (run by hand); these hold the classification.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

SCRIPT = Path(__file__).parents[2] / "scripts" / "profile_stages.py"
_LOOP = "main (llmgw/cli/main.py:165);serve (llmgw/cli/serve.py:96);Runner.run (asyncio/runners.py:118)"


def _script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("profile_stages", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["profile_stages"] = module
    spec.loader.exec_module(module)
    return module


def test_a_sample_belongs_to_the_innermost_stage_not_the_ones_around_it() -> None:
    """The stages nest like middlewares: the metrics stage is on every stack, the proxy innermost."""
    stack = [
        *_LOOP.split(";"),
        "GatewayMetrics.observe (llmgw/gateway/metrics.py:120)",
        "Authenticate.__call__ (llmgw/gateway/auth.py:134)",
        "Router.__call__ (llmgw/gateway/router.py:200)",
        "_send (llmgw/gateway/proxy.py:250)",
        "ClientSession._request (aiohttp/client.py:700)",
    ]
    assert _script().stage_of(stack) == "proxy"
    assert _script().stage_of(stack[:-2]) == "router"


def test_samples_outside_llmgw_are_named_by_the_library_and_logging_wherever_it_is() -> None:
    script = _script()
    loop = _LOOP.split(";")
    assert script.stage_of([*loop, "select (selectors.py:468)"]) == "waiting in epoll"
    server = "RequestHandler.start (aiohttp/web_protocol.py:600)"
    written = [*loop, server, "write (asyncio/selector_events.py:1)"]
    assert script.stage_of(written) == "aiohttp server, outside the stages"
    logged = [*loop, "Admission.__call__ (llmgw/gateway/admission.py:9)", "_proxy (structlog/_native.py:1)"]
    assert script.stage_of(logged) == "logging"


def test_shares_count_each_stack_by_its_samples_and_llmgws_own_lines_apart() -> None:
    lines = [
        f"{_LOOP};Quotas.admit (llmgw/gateway/quotas.py:300) 3",
        f"{_LOOP};_send (llmgw/gateway/proxy.py:250);ClientSession._request (aiohttp/client.py:700) 1",
        "",
    ]
    assert _script().shares(lines) == [("admission", 0.75, 0.75), ("proxy", 0.25, 0.0)]
