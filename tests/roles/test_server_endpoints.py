"""An endpoint model on a real server: routed, shown in words, its key on no surface."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from click.testing import CliRunner
from structlog.testing import capture_logs

from llmgw.cli.ctl import ctl
from llmgw.config import (
    AuthConfig,
    ControlConfig,
    EndpointConfig,
    ModelConfig,
    MonitoringConfig,
    ProfileConfig,
    ServerConfig,
)
from llmgw.roles.server import server_role
from tests.gateway.fake_upstream import KEY, NAME, FakeUpstream, serve
from tests.servers import loopback_server_config
from tests.waiting import eventually_async

ENV = "LLMGW_TEST_UPSTREAM_KEY"


def _cfg(tmp_path: Path, url: str) -> ServerConfig:
    return loopback_server_config(
        tmp_path,
        hosts=("127.0.0.1", "localhost"),
        auth=AuthConfig(enabled=True),
        control=ControlConfig(interval_s=0.2, endpoint_check_s=0.2),
        monitoring=MonitoringConfig(),
        models=[
            ModelConfig(name="ext-chat", endpoints=[EndpointConfig(url=url, model=NAME, api_key_env=ENV)]),
            ModelConfig(
                name="fleet-chat", replicas=0, profiles=[ProfileConfig(engine="sim")], fallbacks=["ext-chat"]
            ),
        ],
    )


async def _ctl(*args: str) -> str:
    # In a thread: ctl runs its own event loop, and the server it talks to runs on this one.
    result = await asyncio.to_thread(CliRunner().invoke, ctl, list(args), catch_exceptions=False)
    return result.stdout + result.stderr


async def _get(session: aiohttp.ClientSession, url: str) -> str:
    async with session.get(url) as reply:
        return f"{reply.status} {dict(reply.headers)} {await reply.text()}"


async def _chat(session: aiohttp.ClientSession, url: str, key: str, model: str, **more: Any) -> str:
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8, **more}
    async with session.post(
        f"{url}/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {key}"}
    ) as r:
        return f"{r.status} {dict(r.headers)} {await r.text()}"


async def test_the_upstream_key_appears_on_no_surface_while_the_endpoint_serves_and_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setenv(ENV, KEY)
    seen: list[str] = []
    with capture_logs() as logs:
        async with serve(FakeUpstream()) as upstream:
            # In a thread: making its certificates writes files.
            cfg = await asyncio.to_thread(_cfg, tmp_path, upstream.url)
            async with server_role(cfg) as server:
                key = await server.create_dev_key()
                admin = server.admin_url
                async with aiohttp.ClientSession() as session:

                    async def ready() -> bool:
                        return '"state": "ready"' in await _get(
                            session, f"{admin}/api/v1/replicas?model=ext-chat"
                        )

                    await eventually_async(ready)
                    gateway = server.gateway_url
                    seen.append(await _chat(session, gateway, key, "ext-chat"))
                    assert seen[-1].startswith("200")
                    seen.append(await _chat(session, gateway, key, "ext-chat", stream=True))
                    # A fleet model with no replica falls back to the endpoint model.
                    seen.append(await _chat(session, gateway, key, "fleet-chat"))
                    assert seen[-1].startswith("200") and "'x-llmgw-model': 'ext-chat'" in seen[-1].lower()
                    for mode in ("500", "400", "429", "404"):
                        upstream.mode = mode
                        seen.append(await _chat(session, gateway, key, "ext-chat"))
                    upstream.mode = "ok"
                    # The key is rotated upstream: the next check and the next request find this one wrong.
                    upstream.key = "rotated"
                    seen.append(await _chat(session, gateway, key, "ext-chat"))
                    assert seen[-1].startswith("502") and "key for it is wrong" in seen[-1]

                    async def failing() -> bool:
                        return "its key is wrong" in await _ctl("--server", admin, "replicas")

                    await eventually_async(failing)
                    for path in (
                        "/api/v1/models",
                        "/api/v1/replicas",
                        "/api/v1/status",
                        "/api/v1/openapi.json",
                    ):
                        seen.append(await _get(session, admin + path))
                    for path in ("/models", "/", "/metrics"):
                        seen.append(await _get(session, admin + path))
                    seen.append(await _get(session, f"{gateway}/v1/models"))
                    for args in (("models",), ("replicas",), ("models", "--json"), ("replicas", "--json")):
                        seen.append(await _ctl("--server", admin, *args))
    replicas = seen[-1]
    (shown,) = [r for r in json.loads(replicas) if r["shard_id"] == "ext-chat/0"]
    assert shown["engine"] == "endpoint" and shown["state"] == "failing"
    # Said by the request that found it, or by the check after it.
    assert (
        shown["detail"].startswith(f"{upstream.url} answered 401") and "its key is wrong" in shown["detail"]
    )
    assert "endpoint failing" in seen[-3]
    everything = "\n".join(seen) + repr(logs)
    assert KEY not in everything
    # Nor the start a cloud API's 401 quotes of it.
    assert KEY[:6] + "..." not in everything
