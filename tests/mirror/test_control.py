"""The control plane's side: `llmgw ctl mirror` through the server's admin API, relayed to the mirror."""

from __future__ import annotations

import asyncio
import hashlib
import os
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiohttp import web

from llmgw.adminapi import mirror as relay
from llmgw.catalog import Catalog, parse_model
from llmgw.config import MirrorClientConfig, ModelConfig, ProfileConfig, ServerConfig, TLSConfig
from llmgw.control.inventory import Inventory
from llmgw.control.mirror import MirrorClient, MirrorError, parse_mirror_source
from llmgw.control.reconciler import Reconciler
from llmgw.errors import CertificateError, ConfigError
from llmgw.proto.llmgw import v1 as pb
from llmgw.roles.mirror import MirrorHandle
from tests.mirror.test_admin import Certs, certs, mirror  # noqa: F401
from tests.mirror.test_fetch import COMMIT, WEIGHTS, Hub, hub  # noqa: F401


async def _serve(client: MirrorClient | None) -> tuple[web.AppRunner, str]:
    app = web.Application()
    relay.install(app, client)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    return runner, f"http://127.0.0.1:{runner.addresses[0][1]}"


@pytest.fixture
async def server(
    mirror: MirrorHandle,  # noqa: F811
    certs: Certs,  # noqa: F811
) -> AsyncIterator[str]:
    """The admin API's mirror routes, as the server's admin listener serves them."""
    assert mirror.admin_url is not None
    cfg = MirrorClientConfig(api=mirror.admin_url, url=mirror.url, tls=certs.control_plane)
    async with MirrorClient(cfg) as client:
        runner, url = await _serve(client)
        try:
            yield url
        finally:
            await runner.cleanup()


async def _ctl(server: str, *args: str) -> tuple[int, str, str]:
    src = str(Path(__file__).parent.parent.parent / "src")
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "llmgw",
        "ctl",
        "--server",
        server,
        "mirror",
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": src},
    )
    out, err = await process.communicate()
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


async def _start_for(source: str, mirror: MirrorHandle, certs: Certs) -> pb.StartShard | str:  # noqa: F811
    """What the reconciler sends a node for a model whose source is `source`, or why it placed nothing."""
    model = ModelConfig(name="m", source=source, profiles=[ProfileConfig(engine="sim")])
    inventory = Inventory(grace_s=10)
    link = inventory.attach(
        pb.Register(node_id="n1", engine_versions={"sim": "builtin"}, engines_probed=True)
    )
    cfg = ServerConfig(models=[model])
    assert mirror.admin_url is not None
    client_cfg = MirrorClientConfig(api=mirror.admin_url, url=mirror.url, tls=certs.control_plane)
    async with MirrorClient(client_cfg) as client:
        await Reconciler(cfg, inventory, Catalog(cfg), in_flight={}, mirror=client).reconcile()
    if link.outbox.empty():
        return inventory.why_no_ready("m")
    return link.outbox.get_nowait().start


class TestCtlMirror:
    async def test_fetch_list_and_rm_go_through_the_server_to_the_mirror(self, server: str) -> None:
        code, out, err = await _ctl(server, "fetch", "org/model", "--include", "*.safetensors", "--wait")
        assert code == 0, err
        assert f"fetched org/model@main (commit {COMMIT}): 1 files, 2.1 MB" in out
        code, out, err = await _ctl(server, "list")
        assert code == 0, err
        assert out.splitlines() == [
            "MODEL                   FETCHED AS  FILES  SIZE",
            f"org/model@{COMMIT[:12]}  main        1      2.1 MB",
        ]
        code, out, err = await _ctl(server, "rm", "org/model@main")
        assert (code, out.strip()) == (0, f"removed org/model@{COMMIT} (2.1 MB)"), err
        code, out, _ = await _ctl(server, "list")
        assert out.splitlines() == ["MODEL  FETCHED AS  FILES  SIZE"]

    async def test_a_failed_fetch_ends_ctl_with_the_file_and_why(
        self,
        server: str,
        hub: Hub,  # noqa: F811
    ) -> None:
        hub.tampered["model.safetensors"] = bytes(len(WEIGHTS))
        code, _, err = await _ctl(server, "fetch", "org/model@main", "--wait")
        assert code == 1
        assert "model.safetensors: sha256 does not match the hub's" in err

    async def test_removing_what_the_mirror_does_not_have_exits_4(self, server: str) -> None:
        code, _, err = await _ctl(server, "rm", "org/other@main")
        assert (code, err.strip()) == (4, "llmgw ctl: org/other@main is not on this mirror")


class TestTheRelay:
    async def test_without_a_mirror_configured_the_api_says_what_to_set(self) -> None:
        runner, url = await _serve(None)
        try:
            code, _, err = await _ctl(url, "list")
        finally:
            await runner.cleanup()
        assert code == 4
        assert "no mirror is configured: set mirror.api, mirror.url and mirror.tls in server.yaml" in err

    async def test_a_mirror_that_cannot_be_reached_is_named(self, certs: Certs) -> None:  # noqa: F811
        cfg = MirrorClientConfig(api="https://127.0.0.1:9", url="http://127.0.0.1:9", tls=certs.control_plane)
        async with MirrorClient(cfg) as client:
            runner, url = await _serve(client)
            try:
                code, _, err = await _ctl(url, "list")
            finally:
                await runner.cleanup()
        assert code == 1
        assert "the mirror's admin listener at https://127.0.0.1:9 cannot be reached" in err

    async def test_a_control_plane_holding_a_nodes_certificate_is_refused_by_the_mirror(
        self,
        mirror: MirrorHandle,  # noqa: F811
        certs: Certs,  # noqa: F811
    ) -> None:
        assert mirror.admin_url is not None
        cfg = MirrorClientConfig(api=mirror.admin_url, url=mirror.url, tls=certs.node)
        async with MirrorClient(cfg) as client:
            runner, url = await _serve(client)
            try:
                code, _, err = await _ctl(url, "list")
            finally:
                await runner.cleanup()
        assert code == 5
        assert "this listener answers only the control plane" in err


class TestMirrorSources:
    async def test_a_mirror_source_resolves_to_the_mirrors_url_and_the_pins_it_holds(
        self,
        mirror: MirrorHandle,  # noqa: F811
        certs: Certs,  # noqa: F811
        server: str,
    ) -> None:
        code, _, err = await _ctl(server, "fetch", "org/model", "--wait")
        assert code == 0, err
        assert mirror.admin_url is not None
        cfg = MirrorClientConfig(api=mirror.admin_url, url=mirror.url + "/", tls=certs.control_plane)
        async with MirrorClient(cfg) as client:
            url, pins = await client.resolve("mirror:org/model")
            assert (url, pins) == await client.resolve(f"mirror:org/model@{COMMIT}")
            with pytest.raises(
                MirrorError, match=r"mirror:org/model@v2: the mirror does not hold org/model@v2"
            ):
                await client.resolve("mirror:org/model@v2")
        assert url == f"{mirror.url}/files/org/model/{COMMIT}/"
        assert sorted(pins) == ["config.json", "model.safetensors", "tokenizer/tokenizer.json"]

    async def test_a_replica_of_a_mirror_model_starts_with_the_mirrors_url_and_pins(
        self,
        mirror: MirrorHandle,  # noqa: F811
        certs: Certs,  # noqa: F811
        server: str,
    ) -> None:
        code, _, err = await _ctl(server, "fetch", "org/model", "--include", "*.safetensors", "--wait")
        assert code == 0, err
        start = await _start_for("mirror:org/model@main", mirror, certs)
        assert isinstance(start, pb.StartShard)
        assert start.source == f"{mirror.url}/files/org/model/{COMMIT}/"
        assert start.sha256 == {"model.safetensors": hashlib.sha256(WEIGHTS).hexdigest()}

    async def test_a_mirror_model_the_mirror_does_not_hold_is_not_placed_and_says_why(
        self,
        mirror: MirrorHandle,  # noqa: F811
        certs: Certs,  # noqa: F811
    ) -> None:
        why = await _start_for("mirror:org/model@v2", mirror, certs)
        assert why == (
            "m has no ready replica: mirror:org/model@v2: the mirror does not hold org/model@v2 "
            "(it has none of it); "
            "`llmgw ctl mirror fetch org/model@v2` fetches it"
        )

    def test_a_catalog_model_naming_the_mirror_badly_or_with_its_own_pins_is_refused(self) -> None:
        with pytest.raises(
            ConfigError, match=r"'source' is 'mirror:\.\./x': '\.\./x' is not a repository name"
        ):
            parse_model("name: m\nsource: mirror:../x\nprofiles: [{engine: sim}]\n", "m.yaml")
        with pytest.raises(ConfigError, match=r"m takes its weights from the mirror, whose pins nodes check"):
            pinned = f"name: m\nsource: mirror:org/model\nsha256: {{a.gguf: '{'ab' * 32}'}}\n"
            parse_model(pinned + "profiles: [{engine: sim}]\n", "m.yaml")
        assert parse_model("name: m\nsource: mirror:org/model@main\nprofiles: [{engine: sim}]\n", "m.yaml")

    def test_a_malformed_mirror_source_is_refused_in_words(self) -> None:
        with pytest.raises(MirrorError, match=r"mirror:\.\./x: '\.\./x' is not a repository name"):
            parse_mirror_source("mirror:../x")


def test_the_client_certificate_must_exist(tmp_path: Path) -> None:
    tls = TLSConfig(ca=str(tmp_path / "ca.pem"), cert=str(tmp_path / "c.pem"), key=str(tmp_path / "k.pem"))

    async def enter() -> None:
        async with MirrorClient(MirrorClientConfig(api="https://127.0.0.1:9", tls=tls)):
            pass

    with pytest.raises(CertificateError, match=r"tls.ca names .*ca\.pem, which does not exist"):
        asyncio.run(enter())
