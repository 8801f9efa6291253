"""A running server with a mirror: its admin listener relays to the mirror and shows the mirror page."""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import jsonschema
import pytest
from openapi_spec_validator import validate
from structlog.testing import capture_logs

from llmgw.adminapi.auth import hash_token
from llmgw.config import AuthConfig, ControlConfig, MirrorClientConfig, ServerConfig
from llmgw.roles.mirror import MirrorHandle
from llmgw.roles.server import ServerHandle, server_role
from tests.mirror.test_admin import Certs, certs, mirror  # noqa: F401
from tests.mirror.test_fetch import COMMIT, Hub, hub  # noqa: F401
from tests.servers import loopback_server_config

TOKEN = "llmgw-admin-test"


def _server_cfg(tmp_path: Path, to_mirror: MirrorClientConfig) -> ServerConfig:
    return loopback_server_config(
        tmp_path,
        pki_name="server-pki",
        auth=AuthConfig(enabled=True),
        control=ControlConfig(enabled=False),
        mirror=to_mirror,
        admin_tokens=[hash_token(TOKEN)],
    )


@pytest.fixture
async def server(
    mirror: MirrorHandle,  # noqa: F811
    certs: Certs,  # noqa: F811
    tmp_path: Path,
) -> AsyncIterator[ServerHandle]:
    assert mirror.admin_url is not None
    client = MirrorClientConfig(api=mirror.admin_url, url=mirror.url, tls=certs.control_plane)
    cfg = await asyncio.to_thread(_server_cfg, tmp_path, client)
    with capture_logs():
        async with server_role(cfg) as handle:
            yield handle


async def test_the_servers_admin_listener_relays_a_fetch_and_shows_it_on_the_mirror_page(
    server: ServerHandle,
    mirror: MirrorHandle,  # noqa: F811
) -> None:
    async with aiohttp.ClientSession() as http:
        body = {"model": "org/model", "include": ["*.json"]}
        async with http.post(server.admin_url + "/api/v1/mirror/fetches", json=body) as reply:
            assert reply.status == 202
            fetch = await reply.json()
        state = fetch["state"]
        while state == "running":
            async with http.get(f"{server.admin_url}/api/v1/mirror/fetches/{fetch['id']}") as reply:
                state = (await reply.json())["state"]
        assert state == "done"
        async with http.get(server.admin_url + "/mirror") as page:
            assert page.status == 200
            html = await page.text()
        # On the client port the API needs an admin token.
        async with http.get(server.gateway_url + "/admin/api/v1/mirror/models") as refused:
            assert refused.status == 401
            assert "needs an admin token" in (await refused.json())["error"]
        # On the client port the same page is an administrator's only.
        async with http.get(server.gateway_url + "/admin/mirror", allow_redirects=False) as anonymous:
            assert anonymous.status in (302, 303, 401, 403)
    assert f"mirror:org/model@{COMMIT}" in html
    assert "org/model@main" in html and "done" in html
    assert mirror.admin_url is not None and mirror.admin_url in html


async def test_a_server_without_a_mirror_has_no_mirror_page_and_its_api_says_what_to_set(
    tmp_path: Path,
) -> None:
    cfg = await asyncio.to_thread(_server_cfg, tmp_path, MirrorClientConfig())
    with capture_logs():
        async with server_role(cfg) as handle, aiohttp.ClientSession() as http:
            async with http.get(handle.admin_url + "/mirror") as page:
                assert page.status == 404
            async with http.get(handle.admin_url + "/api/v1/mirror/models") as reply:
                assert reply.status == 404
                assert "no mirror is configured" in (await reply.json())["error"]


async def test_ctl_reaches_the_mirror_through_admin_on_the_client_port_with_a_token(
    server: ServerHandle,
) -> None:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "llmgw",
        "ctl",
        "--server",
        server.gateway_url + "/admin",
        "--token",
        TOKEN,
        "mirror",
        "fetch",
        "org/model",
        "--include",
        "config.json",
        "--wait",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).parent.parent.parent / "src")},
    )
    out, err = await process.communicate()
    assert process.returncode == 0, err.decode()
    assert f"fetched org/model@main (commit {COMMIT}): 1 files" in out.decode()


async def test_every_mirror_reply_is_what_the_admin_apis_document_says(server: ServerHandle) -> None:
    async with aiohttp.ClientSession() as http:
        async with http.get(server.admin_url + "/api/v1/openapi.json") as reply:
            doc = await reply.json()
        validate(doc)

        async def check(method: str, route: str, url: str, body: Any = None) -> Any:
            async with http.request(method, server.admin_url + url, json=body) as reply:
                data = await reply.json()
                status = reply.status
            schema = doc["paths"][route][method.lower()]["responses"][str(status)]["content"][
                "application/json"
            ]
            jsonschema.validate(data, {**schema["schema"], "components": doc["components"]})
            return data

        fetch = await check(
            "POST", "/api/v1/mirror/fetches", "/api/v1/mirror/fetches", {"model": "org/model"}
        )
        while fetch["state"] == "running":
            fetch = await check("GET", "/api/v1/mirror/fetches/{id}", f"/api/v1/mirror/fetches/{fetch['id']}")
        await check("GET", "/api/v1/mirror/fetches", "/api/v1/mirror/fetches")
        assert (await check("GET", "/api/v1/mirror/models", "/api/v1/mirror/models"))["models"]
        await check("DELETE", "/api/v1/mirror/models", "/api/v1/mirror/models?model=org/model@main", {})
        await check("DELETE", "/api/v1/mirror/models", "/api/v1/mirror/models?model=org/model@main", {})
        await check("GET", "/api/v1/mirror/fetches/{id}", "/api/v1/mirror/fetches/999")
