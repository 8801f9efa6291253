"""The mirror's admin listener over real mutual TLS on loopback: who it answers, and what it does."""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import attrs
import pytest

from llmgw import pki
from llmgw.config import MirrorConfig, TLSConfig
from llmgw.errors import ConfigError
from llmgw.roles.mirror import MirrorHandle, mirror_role
from tests.mirror.test_fetch import COMMIT, WEIGHTS, Hub, hub  # noqa: F401


@attrs.frozen
class Certs:
    mirror: TLSConfig
    control_plane: TLSConfig
    # A node's certificate: signed by the same authority, but not the control plane's.
    node: TLSConfig
    # The control plane's name, signed by an authority the mirror has never heard of.
    stranger: TLSConfig


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    root = tmp_path_factory.mktemp("pki")
    ca, other = root / "ca", root / "other-ca"
    pki.init_ca(ca)
    pki.init_ca(other)
    ca_pem = str(ca / "ca.pem")
    cert, key = pki.issue_server(ca, "mirror", ["127.0.0.1"], root / "mirror")
    cp_cert, cp_key = pki.issue_agent(ca, "control-plane", root / "cp")
    n_cert, n_key = pki.issue_agent(ca, "n1", root / "node")
    s_cert, s_key = pki.issue_agent(other, "control-plane", root / "stranger")
    return Certs(
        mirror=TLSConfig(ca=ca_pem, cert=str(cert), key=str(key)),
        control_plane=TLSConfig(ca=ca_pem, cert=str(cp_cert), key=str(cp_key)),
        node=TLSConfig(ca=ca_pem, cert=str(n_cert), key=str(n_key)),
        stranger=TLSConfig(ca=ca_pem, cert=str(s_cert), key=str(s_key)),
    )


@pytest.fixture
async def mirror(hub: Hub, certs: Certs, tmp_path: Path) -> AsyncIterator[MirrorHandle]:  # noqa: F811
    cfg = MirrorConfig(
        listen="127.0.0.1:0",
        root=str(tmp_path / "mirror"),
        hf_endpoint=hub.url,
        admin_listen="127.0.0.1:0",
        admin_tls=certs.mirror,
        control_plane="control-plane",
    )
    await asyncio.to_thread((tmp_path / "mirror").mkdir)
    async with mirror_role(cfg) as handle:
        yield handle


async def _call(
    handle: MirrorHandle, tls: TLSConfig, method: str, path: str, body: Any = None
) -> tuple[int, Any]:
    ctx = await asyncio.to_thread(pki.https_client_ssl_context, tls, "the test")
    assert handle.admin_url is not None
    async with (
        aiohttp.ClientSession() as http,
        http.request(method, handle.admin_url + path, json=body, ssl=ctx) as reply,
    ):
        return reply.status, await reply.json()


async def _finished(handle: MirrorHandle, certs: Certs, fetch_id: str) -> Any:
    """The fetch once it is no longer running, asked for again and again (each ask is a round trip)."""
    seen: list[Any] = []

    async def ask() -> None:
        _, fetch = await _call(handle, certs.control_plane, "GET", f"/api/v1/fetches/{fetch_id}")
        seen.append(fetch)

    await ask()
    while seen[-1]["state"] == "running":
        await asyncio.wait_for(ask(), 10)
    return seen[-1]


class TestWhoMayAsk:
    async def test_the_control_planes_certificate_is_answered(
        self, mirror: MirrorHandle, certs: Certs
    ) -> None:
        status, body = await _call(mirror, certs.control_plane, "GET", "/api/v1/models")
        assert (status, body) == (200, {"models": []})

    async def test_a_nodes_certificate_from_the_same_authority_is_refused(
        self, mirror: MirrorHandle, certs: Certs
    ) -> None:
        status, body = await _call(mirror, certs.node, "DELETE", "/api/v1/models?model=org/model@main")
        assert status == 403
        assert (
            body["error"]
            == "this listener answers only the control plane (certificate 'control-plane'), not 'n1'"
        )

    async def test_a_certificate_from_another_authority_fails_the_handshake(
        self, mirror: MirrorHandle, certs: Certs
    ) -> None:
        with pytest.raises(aiohttp.ClientError):
            await _call(mirror, certs.stranger, "GET", "/api/v1/models")

    async def test_a_client_without_a_certificate_fails_the_handshake(
        self, mirror: MirrorHandle, certs: Certs
    ) -> None:
        ctx = ssl.create_default_context(cafile=certs.mirror.ca)
        assert mirror.admin_url is not None
        async with aiohttp.ClientSession() as http:
            with pytest.raises(aiohttp.ClientError):
                async with http.get(mirror.admin_url + "/api/v1/models", ssl=ctx) as reply:
                    await reply.read()

    async def test_an_admin_listener_without_the_control_planes_name_is_refused_at_start(
        self, certs: Certs, tmp_path: Path
    ) -> None:
        cfg = MirrorConfig(
            listen="127.0.0.1:0", root=str(tmp_path), admin_listen="127.0.0.1:0", admin_tls=certs.mirror
        )
        with pytest.raises(ConfigError, match="'control_plane' is not set"):
            async with mirror_role(cfg):
                pass


class TestFetchingThroughTheListener:
    async def test_a_fetch_started_here_runs_reports_progress_and_lists_the_model(
        self, mirror: MirrorHandle, certs: Certs
    ) -> None:
        status, started = await _call(
            mirror,
            certs.control_plane,
            "POST",
            "/api/v1/fetches",
            {"model": "org/model", "include": ["*.safetensors"]},
        )
        assert status == 202 and started["state"] == "running" and started["model"] == "org/model@main"
        fetch = await _finished(mirror, certs, started["id"])
        assert fetch["state"] == "done", fetch
        assert fetch["progress"]["done"] == fetch["progress"]["total"] == len(WEIGHTS)
        assert fetch["fetched"]["commit"] == COMMIT
        _, listed = await _call(mirror, certs.control_plane, "GET", "/api/v1/models")
        (model,) = listed["models"]
        assert (model["repo"], model["commit"]) == ("org/model", COMMIT)
        assert [(f["path"], f["size"]) for f in model["files"]] == [("model.safetensors", len(WEIGHTS))]

    async def test_a_failed_fetch_says_which_file_and_why(
        self,
        mirror: MirrorHandle,
        certs: Certs,
        hub: Hub,  # noqa: F811
    ) -> None:
        hub.gone.add("config.json")
        _, started = await _call(
            mirror, certs.control_plane, "POST", "/api/v1/fetches", {"model": "org/model@main"}
        )
        fetch = await _finished(mirror, certs, started["id"])
        assert fetch["state"] == "failed"
        assert "config.json: HTTP 404 at" in fetch["error"]
        _, listed = await _call(mirror, certs.control_plane, "GET", "/api/v1/fetches")
        assert [f["id"] for f in listed["fetches"]] == [started["id"]]

    async def test_a_malformed_fetch_request_is_refused_in_words(
        self, mirror: MirrorHandle, certs: Certs
    ) -> None:
        status, body = await _call(mirror, certs.control_plane, "POST", "/api/v1/fetches", {"model": "../x"})
        assert (status, body["error"]) == (
            400,
            "'../x' is not a repository name (expected org/model, such as Qwen/Qwen2.5-0.5B)",
        )
        status, body = await _call(
            mirror,
            certs.control_plane,
            "POST",
            "/api/v1/fetches",
            {"model": "org/model", "include": "*.gguf"},
        )
        assert status == 400 and "'include' must be a list of globs" in body["error"]


class TestDeleting:
    async def test_a_model_is_deleted_by_its_revision_and_stops_being_served(
        self, mirror: MirrorHandle, certs: Certs
    ) -> None:
        _, started = await _call(
            mirror, certs.control_plane, "POST", "/api/v1/fetches", {"model": "org/model"}
        )
        await _finished(mirror, certs, started["id"])
        status, body = await _call(
            mirror, certs.control_plane, "DELETE", "/api/v1/models?model=org/model@main"
        )
        assert status == 200 and body["removed"] == f"org/model@{COMMIT}"
        _, listed = await _call(mirror, certs.control_plane, "GET", "/api/v1/models")
        assert listed == {"models": []}
        async with (
            aiohttp.ClientSession() as http,
            http.get(f"{mirror.url}/files/org/model/{COMMIT}/config.json") as reply,
        ):
            assert reply.status == 404

    async def test_deleting_a_model_the_mirror_does_not_have_says_so(
        self, mirror: MirrorHandle, certs: Certs
    ) -> None:
        status, body = await _call(
            mirror, certs.control_plane, "DELETE", "/api/v1/models?model=org/other@main"
        )
        assert (status, body["error"]) == (404, "org/other@main is not on this mirror")

    async def test_a_model_being_fetched_is_not_deleted(
        self,
        mirror: MirrorHandle,
        certs: Certs,
        hub: Hub,  # noqa: F811
    ) -> None:
        _, first = await _call(
            mirror,
            certs.control_plane,
            "POST",
            "/api/v1/fetches",
            {"model": "org/model", "include": ["*.json"]},
        )
        await _finished(mirror, certs, first["id"])
        hub.hold = True
        _, again = await _call(
            mirror, certs.control_plane, "POST", "/api/v1/fetches", {"model": "org/model", "include": ["*"]}
        )
        status, body = await _call(
            mirror, certs.control_plane, "DELETE", f"/api/v1/models?model=org/model@{COMMIT}"
        )
        assert (status, body["error"]) == (
            409,
            "org/model is being fetched; delete it once the fetch has finished",
        )
        hub.release.set()
        assert (await _finished(mirror, certs, again["id"]))["state"] == "done"
