"""A new engine kind is one module and one registry line: the agent's configuration, its supervisor,
engine-check and the catalog then all know it, with nothing added anywhere else."""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from llmgw import config
from llmgw.agent.supervisor import Supervisor
from llmgw.catalog import parse_model
from llmgw.config import AgentConfig
from llmgw.engines import registry
from llmgw.engines.base import last_words
from llmgw.engines.check import check_engine
from llmgw.engines.registry import ENGINES
from llmgw.proto.llmgw import v1 as pb

from .reports import WAIT_S, Reports
from .twin_engine import TwinEngine

AGENT_YAML = f"""\
node_id: n1
engines:
  twin:
    binary: {sys.executable}
    parallel: 3
"""


@pytest.fixture(autouse=True)
def twin_registered(monkeypatch: pytest.MonkeyPatch) -> None:
    # The one registry line: `"twin": TwinEngine(),` in engines/registry.py.
    monkeypatch.setitem(registry._KINDS, "twin", TwinEngine())


@pytest.fixture
def cfg() -> AgentConfig:
    return config.parse(AgentConfig, AGENT_YAML, "agent.yaml")


@pytest.fixture
async def supervisor(
    tmp_path: Path, cfg: AgentConfig
) -> AsyncIterator[tuple[Supervisor, Reports, AgentConfig]]:
    reports = Reports()
    supervisor = Supervisor(
        ENGINES,
        reports,
        ready_timeout_s=WAIT_S,
        state_dir=tmp_path,
        binaries=lambda kind: cfg.engine_options(kind).binary,
        parallel=lambda kind: cfg.engine_options(kind).parallel,
    )
    async with supervisor:
        yield supervisor, reports, cfg


async def test_the_agent_starts_a_new_kind_and_it_becomes_ready_and_serves(
    supervisor: tuple[Supervisor, Reports, AgentConfig],
) -> None:
    sup, reports, cfg = supervisor
    assert cfg.engine_options("twin").parallel == 3
    await sup.start(pb.StartShard(shard_id="s1", model="twin-chat", engine="twin"))
    ready = await reports.wait_for("ready")
    assert ready.engine == "twin"
    assert ready.detail == f"twin answers on {ready.endpoint}"
    async with aiohttp.ClientSession() as session, session.get(ready.endpoint + "/v1/models") as response:
        assert response.status == 200
        assert [m["id"] for m in (await response.json())["data"]] == ["twin-chat"]


async def test_a_new_kind_that_fails_is_told_in_its_own_failure_lines(
    supervisor: tuple[Supervisor, Reports, AgentConfig],
) -> None:
    sup, reports, _ = supervisor
    # An argument the sim refuses: it exits at once with argparse's "error: unrecognized arguments".
    await sup.start(pb.StartShard(shard_id="s1", model="twin-chat", engine="twin", args=["--nope"]))
    failed = await reports.wait_for("failed")
    assert failed.detail.startswith("twin exited with code 2: ")
    assert "unrecognized arguments: --nope" in failed.detail
    # The kind's own reading of its lines decides which one is quoted.
    output = ["loading", "error: not this one", "TWIN! the weights are upside down", "bye"]
    assert last_words(TwinEngine(), output) == "the weights are upside down"


def test_the_agent_configuration_and_the_catalog_take_the_new_kind() -> None:
    assert config.parse(AgentConfig, AGENT_YAML, "agent.yaml").engine_options("twin").binary == sys.executable
    model = parse_model("name: twin-chat\nprofiles:\n  - engine: twin\n", "model.yaml")
    assert model.profiles[0].engine == "twin"


async def test_engine_check_checks_the_new_kind_from_its_module_alone() -> None:
    result = await check_engine("twin", ENGINES["twin"])
    assert result.ok, result
    assert result.help_command.endswith("-m llmgw.engines.sim --help")
