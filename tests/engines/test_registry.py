"""The engine registry and the sim adapter's command line."""

from __future__ import annotations

import asyncio
import sys

import pytest

from llmgw import __version__
from llmgw.engines.base import (
    APIS,
    CHAT,
    COMPLETIONS,
    COUNT_TOKENS,
    EMBEDDINGS,
    MESSAGES,
    RERANK,
    RESPONSES,
    TRANSCRIPTIONS,
    LaunchSpec,
)
from llmgw.engines.registry import ENGINES, get_engine
from llmgw.engines.sim import SimEngine
from llmgw.errors import LlmgwError


def test_the_sim_engine_is_registered_under_its_name() -> None:
    assert isinstance(get_engine("sim"), SimEngine)
    assert ENGINES["sim"].name == "sim"


def test_every_engine_the_catalog_may_name_is_registered_under_its_name() -> None:
    assert sorted(ENGINES) == ["llamacpp", "sglang", "sim", "vllm"]
    for name, engine in ENGINES.items():
        assert engine.name == name


def test_an_unknown_engine_is_refused_naming_the_known_ones() -> None:
    with pytest.raises(
        LlmgwError, match=r"no engine called 'tgi' \(known engines: llamacpp, sglang, sim, vllm\)"
    ):
        get_engine("tgi")


def test_the_sim_command_runs_this_interpreter_with_the_shard_args_last() -> None:
    spec = LaunchSpec(model="sim-chat", port=4321, args=("--ttft-ms", "50"), env=(("A", "1"),))
    engine = SimEngine()
    assert engine.command(spec) == [
        sys.executable,
        "-m",
        "llmgw.engines.sim",
        "--host",
        "127.0.0.1",
        "--port",
        "4321",
        "--model",
        "sim-chat",
        "--ttft-ms",
        "50",
    ]
    assert engine.environment(spec) == {"PYTHONUNBUFFERED": "1", "A": "1"}
    assert engine.probe_command("") == [sys.executable, "-m", "llmgw.engines.sim", "--version"]


async def test_the_sim_probe_command_prints_its_version() -> None:
    process = await asyncio.create_subprocess_exec(
        *SimEngine().probe_command(sys.executable), stdout=asyncio.subprocess.PIPE
    )
    stdout, _ = await process.communicate()
    assert process.returncode == 0
    assert stdout.decode().strip() == f"llmgw-sim {__version__}"


def test_every_engine_serves_chat_completions_and_names_only_known_apis() -> None:
    """Translation lands on chat completions: an engine without them could serve nothing translated."""
    for engine in ENGINES.values():
        assert {CHAT, COMPLETIONS, EMBEDDINGS} <= engine.native_apis <= APIS, engine.name


def test_the_sim_serves_every_api_so_dev_mode_and_the_tests_reach_them_all() -> None:
    assert SimEngine().native_apis == APIS


@pytest.mark.parametrize("name", ["llamacpp", "vllm"])
def test_the_engines_llmgw_installs_speak_messages_natively(name: str) -> None:
    assert {MESSAGES, COUNT_TOKENS, RERANK, TRANSCRIPTIONS} <= get_engine(name).native_apis


def test_vllm_speaks_responses_natively_and_llama_servers_responses_are_translated_from_chat() -> None:
    # llama-server b11434's Responses stream lacks the indexes the openai SDK's stream helper reads.
    assert RESPONSES in get_engine("vllm").native_apis
    assert RESPONSES not in get_engine("llamacpp").native_apis


def test_sglang_serves_every_api_but_transcriptions() -> None:
    assert APIS - get_engine("sglang").native_apis == {TRANSCRIPTIONS}
