"""The admin listener asks no one to sign in, as docs/accounts.md says; a start warns when others reach it."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from structlog.testing import capture_logs

from llmgw.config import AuthConfig, ControlConfig, ServerConfig
from llmgw.roles.server import ServerHandle, server_role
from llmgw.web import admin_listener
from tests.servers import loopback_server_config

ACCOUNTS = Path(__file__).parent.parent.parent / "docs" / "accounts.md"
EXPOSED = "which other machines can reach, and it asks no one to sign in"


@pytest.fixture
def cfg(tmp_path: Path) -> ServerConfig:
    return loopback_server_config(
        tmp_path, auth=AuthConfig(enabled=True), control=ControlConfig(enabled=False), models=[]
    )


@pytest.fixture
async def server(cfg: ServerConfig) -> AsyncIterator[tuple[ServerHandle, list[dict[str, object]]]]:
    with capture_logs() as logged:
        async with server_role(cfg) as handle:
            yield handle, logged


async def test_the_admin_listeners_pages_answer_without_sign_in_as_accounts_md_says(
    server: tuple[ServerHandle, list[dict[str, object]]],
) -> None:
    """docs/accounts.md said the admin listener used the same sign-in as the client port; it uses none."""
    said = re.sub(r"\s+", " ", ACCOUNTS.read_text(encoding="utf-8"))
    assert "serves the cluster pages and the admin API without sign-in: it asks no one to sign in" in said
    handle, _ = server
    async with aiohttp.ClientSession() as session:
        for page in ("/", "/models"):
            async with session.get(handle.admin_url + page, allow_redirects=False) as reply:
                assert (reply.status, reply.content_type) == (200, "text/html"), page
        # The same pages under /admin on the client port need an administrator's session.
        async with session.get(handle.gateway_url + "/admin/models", allow_redirects=False) as reply:
            assert reply.status in (302, 303) and reply.headers["Location"].startswith("/login")


async def test_a_server_with_its_admin_listener_on_loopback_warns_of_nothing(
    server: tuple[ServerHandle, list[dict[str, object]]],
) -> None:
    _, logged = server
    assert not [e for e in logged if EXPOSED in str(e["event"])]


async def test_a_server_whose_admin_listener_other_machines_reach_warns_at_start(
    cfg: ServerConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Tests bind loopback only: the listener's address is read as if it were 0.0.0.0."""
    judge = admin_listener.exposure
    monkeypatch.setattr(admin_listener, "exposure", lambda host, port: judge("0.0.0.0", port))
    with capture_logs() as logged:
        async with server_role(cfg):
            pass
    [warning] = [e for e in logged if EXPOSED in str(e["event"])]
    assert warning["log_level"] == "warning"
    assert str(warning["event"]).startswith("the admin listener is on 0.0.0.0:")


class TestExposure:
    @pytest.mark.parametrize("host", ["0.0.0.0", "::", "10.1.2.3", "192.168.0.9", "2001:db8::1"])
    def test_an_address_other_machines_reach_is_warned_of(self, host: str) -> None:
        warning = admin_listener.exposure(host, 9090)
        assert warning is not None and EXPOSED in warning and "127.0.0.1" in warning

    @pytest.mark.parametrize("host", ["127.0.0.1", "127.0.0.2", "::1", "::ffff:127.0.0.1"])
    def test_loopback_is_not(self, host: str) -> None:
        assert admin_listener.exposure(host, 9090) is None
