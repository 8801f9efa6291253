"""Every command line the SGLang adapter writes is one SGLang's own argument parser accepts.

The parser is the real one, from the sglang wheel on PyPI: installed once, with
--no-deps and msgspec (the one library it needs to build its parser), into
${LLMGW_BUILD_CACHE:-~/.cache/llmgw}/sglang-args-VERSION (a 40 MB wheel, 220
MB unpacked; later runs find it). Its serving stack (torch, CUDA) is stood in
for by stubs (fixtures/sglang_parser.py): a renamed or dropped flag is caught here, where
engine-check would need a node with SGLang installed. These tests do not skip:
a machine that cannot reach PyPI fails them saying why.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import attrs
import pytest

from llmgw.engines.check import _SPECS
from llmgw.engines.sglang import SglangEngine

# The SGLang release the adapter is checked against; bump it deliberately.
VERSION = "0.5.23"
PARSER = Path(__file__).parent / "fixtures" / "sglang_parser.py"
CACHE = Path(os.environ.get("LLMGW_BUILD_CACHE", Path.home() / ".cache" / "llmgw")) / f"sglang-args-{VERSION}"

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


@pytest.fixture(scope="module")
def sglang_wheel() -> Path:
    """A directory holding sglang VERSION's package and msgspec, installed once."""
    done = CACHE / "installed.txt"
    if not done.exists():
        partial = CACHE.with_name(CACHE.name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        pip = [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(partial)]
        result = subprocess.run(
            [*pip, f"sglang=={VERSION}", "msgspec"], capture_output=True, text=True, check=False
        )
        if result.returncode != 0:
            pytest.fail(f"pip could not install sglang=={VERSION} into {partial}:\n{result.stderr[-3000:]}")
        (partial / "installed.txt").write_text(f"sglang=={VERSION}\nmsgspec\n")
        shutil.rmtree(CACHE, ignore_errors=True)
        partial.rename(CACHE)
    return CACHE


def parse(wheel: Path, argvs: list[list[str]]) -> dict[str, Any]:
    """What SGLang's parser made of each argv (what follows `python -m sglang.launch_server`)."""
    env = {**os.environ, "PYTHONPATH": str(wheel)}
    result = subprocess.run(
        [sys.executable, str(PARSER)], input=json.dumps(argvs), capture_output=True, text=True, env=env
    )
    assert result.returncode == 0, result.stderr[-3000:]
    said: dict[str, Any] = json.loads(result.stdout)
    return said


def adapter_argvs() -> list[list[str]]:
    """Every argv the adapter writes for engine-check's specs, with a secret and as an embedding model."""
    engine = SglangEngine()
    argvs = []
    for spec in _SPECS:
        for variant in (spec, attrs.evolve(spec, secret="s3cret", args=engine.embedding_args)):
            argv = engine.command(attrs.evolve(variant, binary="/opt/sglang/bin/python"))
            assert argv[1:3] == ["-m", "sglang.launch_server"]
            argvs.append(argv[3:])
    return argvs


# A flag no SGLang has: the parser must refuse it, or accepting the adapter's would prove nothing.
UNKNOWN_FLAG = ["--model-path", "/w", "--no-such-flag"]


@pytest.fixture(scope="module")
def parsed(sglang_wheel: Path) -> list[dict[str, Any]]:
    """SGLang's reading of adapter_argvs(), then of UNKNOWN_FLAG: one interpreter start for all."""
    said: list[dict[str, Any]] = parse(sglang_wheel, [*adapter_argvs(), UNKNOWN_FLAG])["parsed"]
    return said


def test_every_argv_the_adapter_writes_is_accepted_by_sglangs_own_parser(
    parsed: list[dict[str, Any]],
) -> None:
    argvs = adapter_argvs()

    refused = [(argv, p["error"]) for argv, p in zip(argvs, parsed[:-1], strict=True) if "error" in p]
    assert refused == []


def test_sglang_reads_each_flag_as_the_value_the_adapter_meant(parsed: list[dict[str, Any]]) -> None:
    """Not only accepted: --tp is the tensor-parallel size, --dist-init-addr rank 0's address."""
    plain, secret, second = (parsed[i]["args"] for i in (0, 1, 2))

    assert (plain["model_path"], plain["host"], plain["port"]) == ("/weights/engine-check", "127.0.0.1", 8000)
    assert plain["served_model_name"] == "engine-check"
    assert (plain["tp_size"], plain["context_length"], plain["max_running_requests"]) == (1, 4096, 4)
    assert plain["enable_metrics"] is True
    assert plain["api_key"] is None and plain["is_embedding"] is False
    assert (secret["api_key"], secret["is_embedding"]) == ("s3cret", True)
    assert (second["tp_size"], second["nnodes"], second["node_rank"]) == (2, 2, 1)
    assert second["dist_init_addr"] == "10.0.0.1:29500"


def test_a_flag_sglang_does_not_know_is_refused_by_the_same_parser(parsed: list[dict[str, Any]]) -> None:
    """The check above can fail: the parser is strict, not stubbed into saying yes."""
    assert "unrecognized arguments: --no-such-flag" in parsed[-1]["error"]
