"""`server init --bundle` leaves the mirror role ready: mirror.yaml, certificates, server.yaml's mirror."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import aiohttp
import attrs

from llmgw import config, pki
from llmgw.catalog import load_server_config
from llmgw.config import MirrorConfig
from llmgw.control.mirror import MirrorClient
from llmgw.roles.mirror import mirror_role
from llmgw.serverinit.controlplane import InitOptions, init_control_plane, next_steps, unit_text
from tests.cli.test_bundle_commands import ARCHIVE, ASSET, _with_engine

from .conftest import FakeSystem


def _options(tmp_path: Path) -> InitOptions:
    bundle, sha = _with_engine(tmp_path)
    return InitOptions(root=tmp_path / "root", bundle=bundle, bundle_sha256=sha, health_timeout_s=0.2)


async def _init(options: InitOptions, machine: FakeSystem) -> list[str]:
    said: list[str] = []
    result = await init_control_plane(options, machine, said.append)
    return said + next_steps(result, options)


def _init_here(options: InitOptions, machine: FakeSystem) -> list[str]:
    """init run to its end from a test that reads files afterwards, outside any event loop."""
    return asyncio.run(_init(options, machine))


class TestServerInitSetsUpTheMirror:
    async def test_the_mirror_role_starts_from_what_init_wrote_and_the_server_reaches_its_admin_listener(
        self, tmp_path: Path
    ) -> None:
        options = _options(tmp_path)
        await _init(options, FakeSystem(systemd=False))
        mirror = await asyncio.to_thread(config.load, MirrorConfig, options.etc / "mirror.yaml")
        assert (mirror.listen, mirror.admin_listen) == ("0.0.0.0:8081", "127.0.0.1:8082")
        assert mirror.control_plane == "control-plane"
        assert Path(mirror.root) == options.root / "var/lib/llmgw-mirror"
        names = await asyncio.to_thread(pki.certificate_names, Path(mirror.admin_tls.cert))
        assert sorted(names) == ["10.0.0.140", "127.0.0.1", "ctl1"]
        server = await asyncio.to_thread(load_server_config, options.config_path)
        assert server.mirror.api == "https://127.0.0.1:8082"
        assert server.mirror.url == "http://10.0.0.140:8081"
        on_port_0 = config.evolve(mirror, listen="127.0.0.1:0", admin_listen="127.0.0.1:0")
        async with mirror_role(on_port_0) as handle, aiohttp.ClientSession() as http:
            assert handle.admin_url is not None
            # The server's own client, with the certificates init wrote into server.yaml.
            async with MirrorClient(attrs.evolve(server.mirror, api=handle.admin_url)) as client:
                assert await client.models() == []
            path = f"/files/engines/ggml-org/llama.cpp/releases/download/b1/{ASSET}"
            async with http.get(handle.url + path) as reply:
                assert await reply.read() == ARCHIVE

    def test_server_yaml_keeps_its_comments_and_a_second_init_keeps_everything(self, tmp_path: Path) -> None:
        options = _options(tmp_path)
        _init_here(options, FakeSystem(systemd=False))
        mirror_yaml = options.etc / "mirror.yaml"
        mirror_yaml.write_text(mirror_yaml.read_text() + "hf_token_file: /etc/llmgw/hf-token\n")
        before = options.config_path.read_text()
        assert "# Written by `llmgw server init`." in before
        said = _init_here(options, FakeSystem(systemd=False))
        assert f"kept  {mirror_yaml} (never overwritten)" in said
        assert f"kept  mirror: in {options.config_path} (never overwritten)" in said
        assert (
            f"kept  {options.etc / 'control-plane.pem'}, the control plane's client certificate"
            in "\n".join(said)
        )
        assert "hf_token_file" in mirror_yaml.read_text()
        assert options.config_path.read_text() == before

    def test_with_the_authority_kept_elsewhere_it_says_which_certificates_to_issue_there(
        self, tmp_path: Path
    ) -> None:
        options = _options(tmp_path)
        elsewhere = tmp_path / "authority"
        pki.init_ca(elsewhere)
        options.etc.mkdir(parents=True)
        cert, key = pki.issue_server(elsewhere, "ctl1", ["ctl1", "10.0.0.140"], elsewhere)
        shutil.copy(cert, options.etc / "server.pem")
        shutil.copy(key, options.etc / "server-key.pem")
        shutil.copy(elsewhere / pki.CA_CERT, options.etc / "ca.pem")
        said = "\n".join(_init_here(options, FakeSystem(systemd=False)))
        assert (
            f"skip  {options.etc / 'mirror.pem'}, the mirror's admin listener: "
            "the authority is kept elsewhere; issue it there" in said
        )
        assert f"skip  {options.etc / 'control-plane.pem'}, the control plane's client certificate" in said

    def test_with_systemd_the_mirror_unit_is_installed_and_started(self, tmp_path: Path) -> None:
        options = _options(tmp_path)
        machine = FakeSystem()
        said = _init_here(options, machine)
        unit = options.root / "etc/systemd/system/llmgw-mirror.service"
        assert unit.read_text() == unit_text("llmgw-mirror.service")
        assert ("systemctl", "enable", "--now", "llmgw-mirror") in machine.commands
        assert "  systemctl status llmgw-mirror   # the mirror role, started with the server" in said

    def test_without_systemd_the_closing_list_says_how_to_start_the_mirror_role(self, tmp_path: Path) -> None:
        said = _init_here(_options(tmp_path), FakeSystem(systemd=False))
        start = next(n for n, line in enumerate(said) if line.startswith("Start it by hand, as root"))
        as_llmgw = "setpriv --reuid=llmgw --regid=llmgw --init-groups --reset-env llmgw"
        assert said[start + 1 : start + 5] == [
            f"  {as_llmgw} --role=server --config /etc/llmgw/server.yaml",
            "and the mirror role, which serves the bundle to the nodes:",
            f"  {as_llmgw} --role=mirror --config /etc/llmgw/mirror.yaml",
            "Then:",
        ]
