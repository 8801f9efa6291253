"""`llmgw server init` as a person runs it: what it prints, and when it refuses."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from unittest.mock import create_autospec, seal

import pytest
from click.testing import CliRunner

from llmgw.cli.exit import EXIT_CONFIG, EXIT_ERROR
from llmgw.cli.server_init import InitSeam, server
from llmgw.serverinit.system import Account, CommandResult, HostSystem


def _machine(*, systemd: bool = False, answers: bool = True) -> HostSystem:
    """A Linux machine without systemd (so nothing is started) whose llmgw user exists."""
    machine = create_autospec(HostSystem, instance=True)
    machine.refusal.return_value = None
    machine.lookup_user.return_value = Account(uid=os.getuid(), gid=os.getgid())
    machine.hostname.return_value = "ctl1"
    machine.addresses.return_value = ["10.0.0.140"]
    machine.has_systemd.return_value = systemd
    machine.systemctl.return_value = CommandResult(0, "")
    machine.healthy.return_value = answers
    machine.registered_nodes.return_value = None
    seal(machine)
    return machine  # type: ignore[no-any-return]


def _init(root: Path, *args: str, machine: HostSystem | None = None) -> tuple[int, str, str]:
    seam = InitSeam(system=machine or _machine(), root=root)
    result = CliRunner().invoke(server, ["init", *args], obj=seam, catch_exceptions=False)
    return result.exit_code, result.stdout, result.stderr


class TestServerInit:
    def test_it_says_ok_for_each_step_and_prints_the_password_once_and_what_next(
        self, tmp_path: Path
    ) -> None:
        code, out, _ = _init(tmp_path, "--admin", "you@example.com", "--host", "llmgw.example.com")
        assert code == 0
        assert "ok    certificate authority in" in out and "back it up" in out
        assert "ok    server certificate for llmgw.example.com, ctl1, 10.0.0.140" in out
        assert "ok    administrator you@example.com" in out and "password: " in out
        assert "setpriv --reuid=llmgw --regid=llmgw --init-groups --reset-env llmgw --role=server" in out
        assert "llmgw ctl status" in out
        assert (
            "scripts/onboard-node.sh --node NAME --addr NODE --server llmgw.example.com:7443 --wheel " in out
        )
        assert "add it under `models:` in /etc/llmgw/server.yaml" in out

        code, again, _ = _init(tmp_path, "--admin", "you@example.com", "--host", "llmgw.example.com")
        assert code == 0 and "password: " not in again
        assert not [line for line in again.splitlines() if line.startswith("ok ")]

    def test_the_node_command_names_an_address_in_the_certificate_not_the_bare_hostname(
        self, tmp_path: Path
    ) -> None:
        """A newcomer's nodes could not resolve `ctl1`; the address is what they reach."""
        code, out, _ = _init(tmp_path)
        assert code == 0
        assert "scripts/onboard-node.sh --node NAME --addr NODE --server 10.0.0.140:7443 --wheel " in out
        assert (
            "# --server: whichever of 10.0.0.140, ctl1 the node reaches (all are in the certificate)" in out
        )

    def test_a_service_that_never_answers_exits_1_naming_the_journal(self, tmp_path: Path) -> None:
        machine = _machine(systemd=True, answers=False)
        # No wait: the test holds what is said, not how long it waits first.
        seam = InitSeam(system=machine, root=tmp_path, health_timeout_s=0.0)
        result = CliRunner().invoke(server, ["init"], obj=seam)
        assert result.exit_code == EXIT_ERROR
        assert "`journalctl -u llmgw-server -n 50` says why" in result.stderr

    def test_a_server_yaml_that_cannot_load_exits_with_the_configuration_code(self, tmp_path: Path) -> None:
        etc = tmp_path / "etc/llmgw"
        etc.mkdir(parents=True)
        (etc / "server.yaml").write_text("lisen: 0.0.0.0:8080\n")
        code, _, err = _init(tmp_path)
        assert code == EXIT_CONFIG
        assert "unknown key 'lisen'; did you mean 'listen'?" in err

    def test_it_is_refused_with_a_sentence_when_not_root(self, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setattr(sys, "platform", "linux")
        monkeypatch.setattr(os, "geteuid", lambda: 1000)
        result = CliRunner().invoke(server, ["init"])
        assert result.exit_code == EXIT_ERROR
        assert "run it as root (sudo llmgw server init …)" in result.stderr

    def test_it_is_refused_with_a_sentence_when_not_on_linux(self, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setattr(sys, "platform", "darwin")
        result = CliRunner().invoke(server, ["init"])
        assert result.exit_code == EXIT_ERROR
        assert "sets up a Linux machine with systemd; this one runs darwin" in result.stderr
