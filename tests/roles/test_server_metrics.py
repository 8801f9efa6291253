"""The server's /metrics: on the admin listener, and alone on `metrics_listen` for a scraper elsewhere."""

from __future__ import annotations

import asyncio
import subprocess
from pathlib import Path

import aiohttp
import attrs
import pytest
from structlog.testing import capture_logs

from llmgw.config import AuthConfig, ControlConfig, ModelConfig, ProfileConfig, ServerConfig
from llmgw.errors import LlmgwError
from llmgw.roles.server import server_role
from tests import needs
from tests.servers import loopback_server_config


@pytest.fixture
def cfg(tmp_path: Path) -> ServerConfig:
    return loopback_server_config(
        tmp_path,
        metrics_listen="127.0.0.1:0",
        auth=AuthConfig(enabled=True),
        control=ControlConfig(interval_s=0.1),
        models=[ModelConfig(name="sim-chat", replicas=1, profiles=[ProfileConfig(engine="sim")])],
        engines={"llamacpp": ""},
    )


async def _get(session: aiohttp.ClientSession, url: str) -> tuple[int, str, str]:
    async with session.get(url) as reply:
        return reply.status, reply.headers.get("Content-Type", ""), await reply.text()


async def test_the_server_serves_gateway_control_plane_and_process_metrics_on_both_listeners(
    cfg: ServerConfig, tmp_path: Path
) -> None:
    with capture_logs():
        async with server_role(cfg) as server, aiohttp.ClientSession() as session:
            key = await server.create_dev_key()
            body = {"model": "sim-chat", "messages": [{"role": "user", "content": "hi"}]}
            # No node: the request is refused with a 503, and counted.
            async with session.post(
                f"{server.gateway_url}/v1/chat/completions",
                json=body,
                headers={"Authorization": f"Bearer {key}"},
            ) as reply:
                assert reply.status == 503
            assert server.metrics_url
            pages = [await _get(session, f"{url}/metrics") for url in (server.metrics_url, server.admin_url)]
    for status, content_type, text in pages:
        assert status == 200
        assert content_type.startswith("text/plain; version=0.0.4")
        assert 'llmgw_requests_total{code="no_ready_replica",model="sim-chat",project="1",' in text
        for name in (
            "llmgw_request_duration_seconds_bucket",
            "llmgw_agent_streams 0.0",
            "llmgw_usage_writer_lag_seconds",
            "llmgw_reconcile_duration_seconds_count",
            'llmgw_placement_failures_total{model="sim-chat",reason="no_node"}',
            "process_cpu_seconds_total",
            "python_info",
        ):
            assert name in text, name
    promtool = needs.program("promtool", "prometheus")
    checked = await asyncio.to_thread(
        subprocess.run, [promtool, "check", "metrics"], input=pages[0][2], capture_output=True, text=True
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr


async def test_metrics_listen_serves_metrics_and_nothing_else(cfg: ServerConfig) -> None:
    with capture_logs():
        async with server_role(cfg) as server, aiohttp.ClientSession() as session:
            for path in ("/", "/v1/models", "/api/v1/status", "/admin", "/health"):
                status, _, _ = await _get(session, f"{server.metrics_url}{path}")
                assert status == 404, path


async def test_without_metrics_listen_no_extra_port_is_opened(cfg: ServerConfig) -> None:
    with capture_logs():
        async with server_role(attrs.evolve(cfg, metrics_listen="")) as server:
            assert server.metrics_url == ""


async def test_a_metrics_listen_address_already_taken_is_refused_naming_the_key(cfg: ServerConfig) -> None:
    with capture_logs():
        async with server_role(cfg) as first:
            taken = first.metrics_url.removeprefix("http://")
            refusals: list[str] = []
            try:
                async with server_role(
                    attrs.evolve(cfg, state_dir=cfg.state_dir + "-2", metrics_listen=taken)
                ):
                    pass
            except* LlmgwError as group:
                refusals = [str(e) for e in group.exceptions]
    assert len(refusals) == 1
    assert refusals[0].startswith(f"cannot listen on {taken} (address already in use)")
    assert refusals[0].endswith("'metrics_listen'")
