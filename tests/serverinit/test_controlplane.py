"""`llmgw server init`'s steps, run against a temporary root with users and systemd stood in for."""

from __future__ import annotations

import asyncio
import pwd
import re
import shlex
import stat
import subprocess
import sys
from pathlib import Path

import aiohttp
import attrs
import pytest

from llmgw import __version__, config, pki
from llmgw.errors import ConfigError
from llmgw.installed import Origin
from llmgw.roles.server import server_role
from llmgw.serverinit.controlplane import InitOptions, InitResult, init_control_plane, next_steps, unit_text
from llmgw.serverinit.mirror import run_as
from llmgw.serverinit.system import HostSystem, InstallError, is_global_unicast
from llmgw.store import open_store
from llmgw.store.catalog import put_model
from llmgw.store.scopes import DEFAULT_PROJECT_ID
from llmgw.store.users import authenticate, create_user
from tests import needs

from .conftest import FakeSystem

REPO = Path(__file__).resolve().parents[2]


async def _init(options: InitOptions, machine: FakeSystem) -> tuple[InitResult, list[str]]:
    lines: list[str] = []
    result = await init_control_plane(options, machine, lines.append)
    return result, lines


def _snapshot(root: Path) -> dict[str, tuple[bytes, int]]:
    """Every file under root with its bytes and mode."""
    return {
        str(p.relative_to(root)): (p.read_bytes(), p.stat().st_mode)
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


class TestInitLeavesAControlPlaneThatStarts:
    async def test_the_server_it_configures_starts_answers_health_and_its_administrator_can_make_a_key(
        self, options: InitOptions, machine: FakeSystem
    ) -> None:
        result, lines = await _init(options, machine)
        assert result.password is not None and result.running
        cfg = result.config
        assert cfg.control.enabled and cfg.models == []
        assert cfg.auth.enabled and cfg.auth.default_rpm > 0 and cfg.auth.default_tpm > 0
        assert cfg.tls.ca and cfg.tls.cert and cfg.tls.key
        assert cfg.default_price.prompt_per_1k > 0 and cfg.default_price.completion_per_1k > 0
        assert any(line.startswith("ok    administrator admin@example.com") for line in lines)
        assert any(result.password in line for line in lines)

        on_port_0 = config.evolve(
            cfg, listen="127.0.0.1:0", admin_listen="127.0.0.1:0", agent_listen="127.0.0.1:0"
        )
        async with server_role(on_port_0) as server:
            jar = aiohttp.CookieJar(unsafe=True)  # keep cookies set by 127.0.0.1, as a browser does
            async with aiohttp.ClientSession(base_url=server.gateway_url, cookie_jar=jar) as browser:
                async with browser.get("/health") as reply:
                    assert reply.status == 200
                page = await (await browser.get("/login")).text()
                signed_in = await browser.post(
                    "/login",
                    data={"email": "admin@example.com", "password": result.password, "csrf": _csrf(page)},
                )
                assert signed_in.status == 200 and signed_in.url.path == "/profile"
                made = await browser.post(
                    "/profile/keys", data={"name": "first", "csrf": _csrf(await signed_in.text())}
                )
                found = re.search(r"sk-llmgw-[A-Za-z0-9_-]+", await made.text())
                assert made.status == 200 and found is not None
                await server.keys.refresh(server.store)
                headers = {"Authorization": f"Bearer {found.group(0)}"}
                async with browser.get("/v1/models", headers=headers) as reply:
                    assert reply.status == 200
            admin = await authenticate(server.store, "admin@example.com", result.password)
            assert admin is not None and admin.is_admin
            # What init asks a server it found running: none has registered with this one.
            assert await HostSystem().registered_nodes(server.admin_url) == 0
        assert await HostSystem().registered_nodes(server.admin_url) is None

    async def test_the_directories_and_key_have_the_modes_the_service_needs(
        self, options: InitOptions, machine: FakeSystem
    ) -> None:
        await _init(options, machine)
        assert machine.commands[0] == ("useradd", "llmgw", "/var/lib/llmgw")
        for path, mode in (
            (options.etc, 0o755),
            (options.state, 0o750),
            (options.pki_dir, 0o700),
            (options.etc / "server-key.pem", 0o640),
            (options.config_path, 0o640),
            (options.pki_dir / "ca-key.pem", 0o600),
        ):
            assert stat.S_IMODE(path.stat().st_mode) == mode, path

    async def test_it_enables_and_starts_the_service_and_waits_for_health(
        self, options: InitOptions, machine: FakeSystem
    ) -> None:
        result, lines = await _init(options, machine)
        assert ("systemctl", "daemon-reload") in machine.commands
        assert ("systemctl", "enable", "--now", "llmgw-server") in machine.commands
        assert result.health_url == "http://127.0.0.1:8080/health"
        assert lines[-1] == f"ok    llmgw-server answers on {result.health_url}"

    async def test_the_unit_installed_is_the_one_in_systemd_in_the_repository(
        self, options: InitOptions, machine: FakeSystem
    ) -> None:
        await _init(options, machine)
        installed = (options.root / "etc/systemd/system/llmgw-server.service").read_bytes()
        assert installed == (REPO / "systemd" / "llmgw-server.service").read_bytes()


class TestInitAgainChangesNothing:
    async def test_a_second_run_keeps_every_file_byte_for_byte_and_the_password(
        self, options: InitOptions, machine: FakeSystem
    ) -> None:
        first, _ = await _init(options, machine)
        before = _snapshot(options.root)
        again, lines = await _init(options, machine)
        assert not again.changed and again.password is None
        assert [line for line in lines if line.startswith("ok ")] == [
            "ok    llmgw-server answers on http://127.0.0.1:8080/health"
        ]
        assert "kept  administrator admin@example.com; its password is unchanged" in lines
        assert _snapshot(options.root) == before
        assert ("systemctl", "restart", "llmgw-server") not in machine.commands
        async with open_store(first.config.database_path) as store:
            assert first.password is not None
            assert await authenticate(store, "admin@example.com", first.password) is not None

    async def test_a_first_run_says_it_created_the_defaults_and_a_later_one_counts_the_models(
        self, options: InitOptions, machine: FakeSystem
    ) -> None:
        """A first run said "kept default organisation…" of a store it had just made, and every
        run ended "no nodes and no models yet", even with two of each."""
        first, lines = await _init(options, machine)
        assert (
            "ok    default organisation, team and project: project 'default' (team 'default', org 'default')"
            in lines
        )
        assert "  llmgw ctl status        # no nodes and no models yet, which is right for now" in (
            next_steps(first, options)
        )
        text = options.config_path.read_text().replace(
            "models: []",
            "models:\n  - {name: a, profiles: [{engine: sim}]}\n  - {name: b, profiles: [{engine: sim}]}",
        )
        options.config_path.write_text(text)
        async with open_store(first.config.database_path) as store:
            await put_model(store, "c", "name: c\nprofiles: [{engine: sim}]\n", "test")
            await put_model(store, "a", "name: a\nprofiles: [{engine: sim}]\n", "test")
        # The server kept running: its admin API says how many nodes it has registered.
        machine.nodes = 2
        again, lines = await _init(options, machine)
        assert (
            "kept  default organisation, team and project: project 'default' (team 'default', org 'default')"
            in lines
        )
        assert ("GET", "http://127.0.0.1:9090/api/v1/nodes") in machine.commands
        assert "  llmgw ctl status        # 2 nodes, and 3 models in the catalog" in next_steps(
            again, options
        )

    async def test_a_server_it_restarts_is_not_asked_for_its_nodes_which_it_has_not_heard_from_yet(
        self, options: InitOptions, machine: FakeSystem
    ) -> None:
        await _init(options, machine)
        machine.nodes = 2
        again, _ = await _init(attrs.evolve(options, hosts=("llmgw.example.com",)), machine)
        assert ("systemctl", "restart", "llmgw-server") in machine.commands
        assert not [c for c in machine.commands if c[0] == "GET"]
        assert (
            "  llmgw ctl status        # the nodes registered so far, and no models yet in the catalog"
            in (next_steps(again, options))
        )

    async def test_a_run_that_stopped_halfway_is_finished(
        self, options: InitOptions, machine: FakeSystem
    ) -> None:
        await _init(options, machine)
        (options.etc / "ca.pem").unlink()
        machine.active = False
        result, lines = await _init(options, machine)
        assert (
            result.changed
            and (options.etc / "ca.pem").read_bytes() == (options.pki_dir / "ca.pem").read_bytes()
        )
        assert "ok    llmgw-server enabled and started" in lines

    async def test_a_change_restarts_a_running_server_so_it_reads_it(
        self, options: InitOptions, machine: FakeSystem
    ) -> None:
        await _init(options, machine)
        await _init(attrs.evolve(options, hosts=("llmgw.example.com",)), machine)
        assert machine.commands[-1] == ("systemctl", "restart", "llmgw-server")

    async def test_an_edited_unit_is_kept_beside_the_one_init_installs(
        self, options: InitOptions, machine: FakeSystem
    ) -> None:
        await _init(options, machine)
        unit = options.root / "etc/systemd/system/llmgw-server.service"
        unit.write_text(unit.read_text() + "Environment=HTTPS_PROXY=http://proxy:3128\n")
        await _init(options, machine)
        assert "HTTPS_PROXY" in (unit.parent / "llmgw-server.service.bak").read_text()
        assert unit.read_text() == await asyncio.to_thread(unit_text, "llmgw-server.service")
        assert ("systemctl", "daemon-reload") in machine.commands
        assert machine.commands[-1] == ("systemctl", "restart", "llmgw-server")

    async def test_a_run_without_admin_names_the_administrator_there_is_rather_than_asking_for_one(
        self, options: InitOptions, machine: FakeSystem
    ) -> None:
        _, lines = await _init(attrs.evolve(options, admin=None), machine)
        assert "skip  no --admin: run init again with --admin EMAIL to create the administrator" in lines
        await _init(options, machine)
        _, lines = await _init(attrs.evolve(options, admin=None), machine)
        assert "kept  administrator admin@example.com" in lines
        assert not any("--admin" in line for line in lines)

    async def test_an_existing_account_is_approved_promoted_and_keeps_its_password(
        self, options: InitOptions, machine: FakeSystem
    ) -> None:
        first, _ = await _init(attrs.evolve(options, admin=None), machine)
        async with open_store(first.config.database_path) as store:
            await create_user(store, "me@example.com", "my own password")
        result, lines = await _init(attrs.evolve(options, admin="me@example.com"), machine)
        assert result.password is None and not any("password:" in line for line in lines)
        assert "ok    me@example.com promoted to administrator; its password is unchanged" in lines
        async with open_store(first.config.database_path) as store:
            me = await authenticate(store, "me@example.com", "my own password")
        assert me is not None and me.is_admin and me.active and me.project_id == DEFAULT_PROJECT_ID


class TestCertificates:
    async def test_a_new_host_reissues_the_certificate_keeping_the_old_names(
        self, options: InitOptions, machine: FakeSystem
    ) -> None:
        await _init(attrs.evolve(options, hosts=("old.example.com",)), machine)
        _, lines = await _init(attrs.evolve(options, hosts=("new.example.com", "203.0.113.10")), machine)
        names = await asyncio.to_thread(pki.certificate_names, options.etc / "server.pem")
        assert set(names) == {"old.example.com", "ctl1", "10.0.0.140", "new.example.com", "203.0.113.10"}
        assert any("added new.example.com, 203.0.113.10" in line for line in lines)
        assert await asyncio.to_thread(
            pki.is_issued_by, options.etc / "server.pem", options.pki_dir / "ca.pem"
        )

    async def test_an_address_the_machine_gained_is_added_and_one_it_lost_is_kept(
        self, options: InitOptions, machine: FakeSystem
    ) -> None:
        await _init(options, machine)
        machine.ips = ["10.0.0.141"]
        await _init(options, machine)
        names = await asyncio.to_thread(pki.certificate_names, options.etc / "server.pem")
        assert set(names) == {"ctl1", "10.0.0.140", "10.0.0.141"}

    async def test_certificates_issued_by_an_authority_elsewhere_are_kept(
        self, options: InitOptions, machine: FakeSystem, tmp_path: Path
    ) -> None:
        before = await asyncio.to_thread(_issued_elsewhere, tmp_path / "elsewhere", options.etc)
        result, lines = await _init(options, machine)
        assert (options.etc / "server.pem").read_bytes() == before
        assert not (options.pki_dir / "ca-key.pem").exists()
        assert f"kept  {options.etc / 'server.pem'}, issued by an authority kept elsewhere" in lines
        assert result.running

    async def test_a_new_host_without_the_authority_is_refused_saying_where_to_reissue(
        self, options: InitOptions, machine: FakeSystem, tmp_path: Path
    ) -> None:
        before = await asyncio.to_thread(_issued_elsewhere, tmp_path / "elsewhere", options.etc)
        with pytest.raises(InstallError, match="reissue it where that authority is kept"):
            await _init(attrs.evolve(options, hosts=("new.example.com",)), machine)
        assert (options.etc / "server.pem").read_bytes() == before

    async def test_half_an_authority_is_refused_rather_than_replaced(
        self, options: InitOptions, machine: FakeSystem
    ) -> None:
        await _init(options, machine)
        (options.pki_dir / "ca-key.pem").unlink()
        (options.etc / "server.pem").unlink()
        with pytest.raises(InstallError, match="restore the other from your backup"):
            await _init(options, machine)

    async def test_an_authority_in_another_directory_is_used_where_pki_names_it(
        self, options: InitOptions, machine: FakeSystem
    ) -> None:
        await _init(attrs.evolve(options, pki=Path("/srv/llmgw-ca")), machine)
        assert (options.root / "srv/llmgw-ca/ca-key.pem").is_file()
        assert not (options.etc / "pki").exists()


class TestConfiguration:
    async def test_an_existing_server_yaml_is_never_overwritten(
        self, options: InitOptions, machine: FakeSystem
    ) -> None:
        await _init(options, machine)
        mine = options.config_path.read_text().replace("default_rpm: 60", "default_rpm: 5")
        options.config_path.write_text(mine)
        await _init(options, machine)
        assert options.config_path.read_text() == mine

    async def test_an_existing_server_yaml_that_cannot_load_is_refused_saying_where(
        self, options: InitOptions, machine: FakeSystem
    ) -> None:
        await _init(options, machine)
        options.config_path.write_text(options.config_path.read_text() + "modles: []\n")
        with pytest.raises(ConfigError, match="unknown key 'modles'; did you mean 'models'"):
            await _init(options, machine)


class TestTheNodeLine:
    """The onboarding line: a node installs the same llmgw, which may be on no package index."""

    async def _line(self, options: InitOptions, machine: FakeSystem, origin: Origin) -> list[str]:
        result, _ = await _init(options, machine)
        said = next_steps(attrs.evolve(result, origin=origin), options)
        start = next(n for n, line in enumerate(said) if "scripts/onboard-node.sh" in line)
        return said[start : start + 2]

    async def test_an_llmgw_installed_from_a_wheel_file_gives_the_node_that_wheel(
        self, options: InitOptions, machine: FakeSystem
    ) -> None:
        wheel = Path("/home/you/llmgw/dist/llmgw-0.1.0-py3-none-any.whl")
        line, why = await self._line(options, machine, Origin(wheel=wheel))
        assert (
            line
            == f"  scripts/onboard-node.sh --node NAME --addr NODE --server 10.0.0.140:7443 --wheel {wheel}"
        )
        assert why.startswith("  # --wheel: the wheel this llmgw was installed from;")

    async def test_an_llmgw_run_from_a_checkout_says_how_to_build_the_wheel_it_names(
        self, options: InitOptions, machine: FakeSystem
    ) -> None:
        line, why = await self._line(options, machine, Origin(checkout=Path("/home/you/llmgw")))
        assert line.endswith(f" --wheel dist/llmgw-{__version__}-py3-none-any.whl")
        assert why == (
            "  # --wheel: this llmgw runs from the checkout /home/you/llmgw, on no package index; "
            "build its wheel there with `python3 -m pip wheel --no-deps -w dist .`"
        )

    async def test_a_release_from_the_index_needs_no_wheel(
        self, options: InitOptions, machine: FakeSystem
    ) -> None:
        line, _ = await self._line(options, machine, Origin())
        assert line == "  scripts/onboard-node.sh --node NAME --addr NODE --server 10.0.0.140:7443"


class TestService:
    async def test_without_systemd_it_says_how_to_start_the_server_by_hand(
        self, options: InitOptions, machine: FakeSystem
    ) -> None:
        machine.systemd = False
        result, lines = await _init(options, machine)
        assert not result.running
        start = "setpriv --reuid=llmgw --regid=llmgw --init-groups --reset-env llmgw --role=server --config "
        assert sum(f"  {start}/etc/llmgw/server.yaml" == line for line in next_steps(result, options)) == 1
        assert not any("sudo" in line for line in [*lines, *next_steps(result, options)])
        assert not (options.root / "etc/systemd").exists()

    def test_the_command_it_prints_to_start_by_hand_is_one_process_of_the_service_user(self) -> None:
        """setpriv execs llmgw: the pid Ctrl-C, `kill` or a supervisor signals is llmgw's own.

        sudo -u and runuser -u stay llmgw's parent, so `kill` of the pid they started reached the
        wrapper, not the server. Run here with the machine's `daemon` user, and Python for llmgw.
        """
        needs.root("becoming another user with setpriv")
        argv = shlex.split(run_as("daemon", "ARGS"))
        assert argv[-2:] == ["llmgw", "ARGS"]
        said = "import os; print(os.getpid(), os.getuid(), os.getgid(), os.environ['HOME'])"
        argv[-2:] = [sys.executable, "-c", said]
        daemon = pwd.getpwnam("daemon")
        with subprocess.Popen(argv, stdout=subprocess.PIPE, text=True) as process:
            out, _ = process.communicate(timeout=60)
        assert process.returncode == 0
        assert out.split() == [str(process.pid), str(daemon.pw_uid), str(daemon.pw_gid), daemon.pw_dir]

    def test_it_waits_thirty_seconds_for_health_before_naming_the_journal(self) -> None:
        assert InitOptions().health_timeout_s == 30.0

    async def test_a_server_that_never_answers_names_the_journal_to_read(
        self, options: InitOptions, machine: FakeSystem
    ) -> None:
        machine.answers = False
        with pytest.raises(InstallError, match=r"`journalctl -u llmgw-server -n 50` says why"):
            await _init(options, machine)


class TestUnits:
    @pytest.mark.parametrize("name", ["llmgw-server.service", "llmgw-agent.service", "llmgw-mirror.service"])
    def test_the_packaged_unit_is_the_one_in_the_repository(self, name: str) -> None:
        assert unit_text(name) == (REPO / "systemd" / name).read_text()

    @pytest.mark.parametrize("name", ["llmgw-server.service", "llmgw-agent.service", "llmgw-mirror.service"])
    def test_every_unit_is_hardened(self, name: str) -> None:
        lines = unit_text(name).splitlines()
        for setting in (
            "NoNewPrivileges=true",
            "ProtectSystem=strict",
            "ProtectHome=true",
            "PrivateTmp=true",
        ):
            assert setting in lines, setting
        assert any(line.startswith("StateDirectory=") for line in lines)

    def test_the_agent_runs_as_root_with_package_directories_writable_and_says_why(self) -> None:
        text = unit_text("llmgw-agent.service")
        assert "User=root" in text and "ReadWritePaths=/usr /etc /opt /var" in text
        assert "package manager" in text


class TestAddresses:
    @pytest.mark.parametrize(
        ("address", "dialable"),
        [
            ("10.0.0.140", True),
            ("203.0.113.10", True),
            ("2001:db8::1", True),
            ("127.0.0.1", False),
            ("::1", False),
            ("fe80::1%eth0", False),
            ("169.254.1.1", False),
            ("0.0.0.0", False),
        ],
    )
    def test_only_addresses_another_machine_could_dial_are_put_in_the_certificate(
        self, address: str, dialable: bool
    ) -> None:
        assert is_global_unicast(address) is dialable


def _csrf(html: str) -> str:
    found = re.search(r'name="csrf" value="([^"]+)"', html)
    assert found is not None, "the page has no form with a CSRF token"
    return found.group(1)


def _issued_elsewhere(elsewhere: Path, etc: Path) -> bytes:
    """The arrangement with the authority on another machine: only its results are copied here."""
    pki.init_ca(elsewhere)
    cert, key = pki.issue_server(elsewhere, "ctl1", ["ctl1", "10.0.0.140"], elsewhere / "out")
    etc.mkdir(parents=True)
    (etc / "ca.pem").write_bytes((elsewhere / "ca.pem").read_bytes())
    (etc / "server.pem").write_bytes(cert.read_bytes())
    (etc / "server-key.pem").write_bytes(key.read_bytes())
    return cert.read_bytes()
