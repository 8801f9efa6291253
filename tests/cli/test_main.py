"""`llmgw` itself: version, roles, and exit codes scripts can rely on."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from llmgw import __version__, config
from llmgw.cli.exit import EXIT_CONFIG
from llmgw.cli.main import main
from llmgw.roles.dev import prepare_dev


def test_python_dash_m_llmgw_prints_its_version() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "llmgw", "--version"], capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == f"llmgw, version {__version__}"


def test_without_a_role_it_prints_help_and_exits_2() -> None:
    result = CliRunner().invoke(main, [])
    assert result.exit_code == 2
    assert "--role" in result.output


def test_a_bad_configuration_exits_with_its_own_code_and_says_where(tmp_path: Path) -> None:
    bad = tmp_path / "server.yaml"
    bad.write_text("listen: 127.0.0.1:0\nauth:\n  enabeld: true\n")
    result = CliRunner().invoke(main, ["--role=server", "--config", str(bad)])
    assert result.exit_code == EXIT_CONFIG
    assert f"{bad}:3: unknown key 'auth.enabeld'; did you mean 'enabled'?" in result.output


def test_a_missing_configuration_file_is_a_configuration_error(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["--role=agent", "--config", str(tmp_path / "agent.yaml")])
    assert result.exit_code == EXIT_CONFIG
    assert "cannot be read" in result.output


def test_more_config_files_than_roles_is_a_usage_error(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        main, ["--role=server", "--config", str(tmp_path / "a"), "--config", str(tmp_path / "b")]
    )
    assert result.exit_code == 2
    assert "one per role" in result.output


def test_a_port_another_program_holds_is_one_sentence_and_exit_1_not_a_traceback(tmp_path: Path) -> None:
    setup = prepare_dev(tmp_path / "dev", ("server",))
    assert setup.server is not None
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        taken = f"127.0.0.1:{holder.getsockname()[1]}"
        server_yaml = tmp_path / "server.yaml"
        server_yaml.write_text(
            config.dump(config.evolve(setup.server, listen=taken, admin_listen="127.0.0.1:0"))
        )
        result = CliRunner().invoke(main, ["--role=server", "--config", str(server_yaml)])
    assert result.exit_code == 1
    assert f"llmgw: cannot listen on {taken} (address already in use)" in result.output
    assert "Traceback" not in result.output


def test_asking_for_uvloop_where_it_is_not_installed_says_how_to_install_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # None in sys.modules makes `import uvloop` fail as it does where uvloop is not installed.
    monkeypatch.setitem(sys.modules, "uvloop", None)
    result = CliRunner().invoke(
        main, ["--role=server", "--dev", "--dev-dir", str(tmp_path), "--loop", "uvloop"]
    )
    assert result.exit_code == EXIT_CONFIG
    assert "uvloop is not installed here; install it with `pip install 'llmgw[uvloop]'`" in result.output
    # Said before anything was written.
    assert list(tmp_path.iterdir()) == []
