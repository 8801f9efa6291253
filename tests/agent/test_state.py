"""Engines that outlive their agent: the state file, adoption by the next agent, weights before start."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import signal
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import aiohttp
import attrs
import psutil
import pytest
from aiohttp import web

from llmgw.agent import state as engine_state
from llmgw.agent.supervisor import Supervisor
from llmgw.agent.weights import WeightsCache
from llmgw.engines.base import Engine, LaunchSpec
from llmgw.engines.registry import ENGINES
from llmgw.engines.sim import SimEngine
from llmgw.proto.llmgw import v1 as pb

from .reports import WAIT_S, Reports


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


async def _eventually(predicate: Callable[[], object], what: str) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + WAIT_S
    while not predicate():
        assert loop.time() < deadline, what
        await asyncio.sleep(0.02)


async def _health(endpoint: str) -> int:
    async with aiohttp.ClientSession() as session, session.get(endpoint + "/health") as response:
        return response.status


@pytest.fixture
def leftovers() -> list[int]:
    """Engine pids a test leaves running on purpose; killed at the end whatever happens."""
    pids: list[int] = []
    yield pids  # type: ignore[misc]
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)


class TestAdoption:
    async def test_an_engine_left_running_on_stop_is_adopted_by_the_next_supervisor(
        self, tmp_path: Path, leftovers: list[int]
    ) -> None:
        first_reports = Reports()
        first = Supervisor(
            ENGINES, first_reports, ready_timeout_s=WAIT_S, state_dir=tmp_path, keep_on_close=True
        )
        await first.start(pb.StartShard(shard_id="s1", model="sim-chat", engine="sim"))
        ready = await first_reports.wait_for("ready")
        leftovers.append(ready.pid)
        await first.aclose()
        assert _alive(ready.pid), "the engine must outlive the supervisor that kept it"
        assert await _health(ready.endpoint) == 200
        assert "stopped" not in [s.state for s in first_reports.statuses]

        reports = Reports()
        async with Supervisor(ENGINES, reports, ready_timeout_s=WAIT_S, state_dir=tmp_path) as second:
            assert await second.adopt() == ["s1"]
            adopted = await reports.wait_for("ready")
            assert (adopted.endpoint, adopted.pid, adopted.model) == (ready.endpoint, ready.pid, "sim-chat")
            assert [s.shard_id for s in second.statuses()] == ["s1"]
            assert "adopted sim (pid" in reports.statuses[0].detail
            # Its output before the restart is still there to read, once the `tail` that follows the
            # log has read it back: that runs beside the health check, so "ready" may come first.
            await _eventually(lambda: second.output("s1"), "the engine's earlier output never came back")
        # This supervisor does not keep engines: closing it stops the adopted one too.
        assert not _alive(ready.pid)
        text = await asyncio.to_thread((tmp_path / engine_state.STATE_FILE).read_text)
        assert json.loads(text) == {"shards": []}

    async def test_a_forced_exit_kills_the_engines_a_clean_stop_had_left_for_the_next_agent(
        self, tmp_path: Path, leftovers: list[int]
    ) -> None:
        """The second signal may come while the rest of llmgw drains, after the agent let go of them."""
        reports = Reports()
        first = Supervisor(ENGINES, reports, ready_timeout_s=WAIT_S, state_dir=tmp_path, keep_on_close=True)
        await first.start(pb.StartShard(shard_id="s1", model="sim-chat", engine="sim"))
        ready = await reports.wait_for("ready")
        leftovers.append(ready.pid)
        await first.aclose()
        assert _alive(ready.pid)
        first.kill_all()
        await asyncio.to_thread(_wait_gone, ready.pid)
        assert not _alive(ready.pid)

    async def test_an_engine_that_died_while_no_agent_ran_is_not_adopted(
        self, tmp_path: Path, leftovers: list[int]
    ) -> None:
        reports = Reports()
        first = Supervisor(ENGINES, reports, ready_timeout_s=WAIT_S, state_dir=tmp_path, keep_on_close=True)
        await first.start(pb.StartShard(shard_id="s1", model="sim-chat", engine="sim"))
        ready = await reports.wait_for("ready")
        leftovers.append(ready.pid)
        await first.aclose()
        os.killpg(ready.pid, signal.SIGKILL)
        await asyncio.to_thread(_wait_gone, ready.pid)
        async with Supervisor(ENGINES, Reports(), state_dir=tmp_path) as second:
            assert await second.adopt() == []
            assert second.statuses() == []

    async def test_a_pid_reused_by_another_process_is_not_adopted(self, tmp_path: Path) -> None:
        """The test's own pid, with another start time: adopting it would mean killing the test."""
        record = engine_state.EngineRecord(
            request=pb.StartShard(shard_id="s1", model="sim-chat", engine="sim"),
            pid=os.getpid(),
            started=1,
            endpoint="http://127.0.0.1:1",
            log=str(tmp_path / "s1.log"),
        )
        await asyncio.to_thread(engine_state.write_state, tmp_path, [record])
        async with Supervisor(ENGINES, Reports(), state_dir=tmp_path) as supervisor:
            assert await supervisor.adopt() == []

    async def test_without_keeping_engines_closing_stops_them_all(self, tmp_path: Path) -> None:
        reports = Reports()
        async with Supervisor(ENGINES, reports, ready_timeout_s=WAIT_S, state_dir=tmp_path) as supervisor:
            await supervisor.start(pb.StartShard(shard_id="s1", model="sim-chat", engine="sim"))
            ready = await reports.wait_for("ready")
            records = await asyncio.to_thread(engine_state.read_state, tmp_path)
            assert [(r.request.shard_id, r.pid, r.endpoint) for r in records] == [
                ("s1", ready.pid, ready.endpoint)
            ]
        assert not _alive(ready.pid)
        assert await asyncio.to_thread(engine_state.read_state, tmp_path) == []

    async def test_an_engine_writing_to_its_log_file_survives_an_agent_killed_outright(
        self, tmp_path: Path, leftovers: list[int]
    ) -> None:
        """No pipe to the agent: an engine whose reader vanished would die of SIGPIPE at its next line."""
        reports = Reports()
        supervisor = Supervisor(
            ENGINES, reports, ready_timeout_s=WAIT_S, state_dir=tmp_path, keep_on_close=True
        )
        await supervisor.start(pb.StartShard(shard_id="s1", model="sim-chat", engine="sim"))
        ready = await reports.wait_for("ready")
        leftovers.append(ready.pid)
        assert os.readlink(f"/proc/{ready.pid}/fd/1") == str(engine_state.log_path(tmp_path, "s1"))
        await supervisor.aclose()


class TestLogFiles:
    @pytest.mark.parametrize(
        ("shard_id", "model"),
        [("../../../escape-1a2b", "../../../escape"), ("org/model-1a2b", "org/model")],
    )
    async def test_an_engine_s_log_stays_in_the_state_directory_whatever_the_shard_is_called(
        self, tmp_path: Path, shard_id: str, model: str
    ) -> None:
        """A shard id from a control plane that did not check names must not put a file anywhere else."""
        state_dir = tmp_path / "a" / "b" / "state"
        reports = Reports()
        async with Supervisor(ENGINES, reports, ready_timeout_s=WAIT_S, state_dir=state_dir) as supervisor:
            await supervisor.start(pb.StartShard(shard_id=shard_id, model=model, engine="sim"))
            ready = await reports.wait_for("ready", shard_id)
            written = Path(os.readlink(f"/proc/{ready.pid}/fd/1"))
            assert written.parent == state_dir / engine_state.LOG_DIR
            assert any(f"serving {model}" in line for line in supervisor.output(shard_id))
        made = await asyncio.to_thread(
            lambda: sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*"))
        )
        assert all(p.startswith("a/b/state") or p in ("a", "a/b") for p in made), made


def _wait_gone(pid: int) -> None:
    with contextlib.suppress(psutil.NoSuchProcess):
        psutil.Process(pid).wait(30)


@attrs.define
class RecordingSim(Engine):
    """The sim engine, remembering the specs it was started with."""

    specs: list[LaunchSpec] = attrs.field(factory=list)
    name: str = "sim"
    health_path: str = "/health"
    metrics_path: str = "/metrics"

    def command(self, spec: LaunchSpec) -> list[str]:
        self.specs.append(spec)
        return SimEngine().command(spec)

    def environment(self, spec: LaunchSpec) -> dict[str, str]:
        return SimEngine().environment(spec)

    def probe_command(self, binary: str) -> list[str]:
        return SimEngine().probe_command(binary)


class TestWeightsBeforeStart:
    @pytest.fixture
    async def origin(self) -> AsyncIterator[str]:
        app = web.Application()

        async def weights(_: web.Request) -> web.Response:
            return web.Response(body=b"GGUF" + b"\0" * 4096)

        app.router.add_get("/tiny.gguf", weights)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        yield f"http://127.0.0.1:{runner.addresses[0][1]}/tiny.gguf"
        await runner.cleanup()

    async def test_the_engine_starts_on_the_fetched_file_after_reporting_the_download(
        self, origin: str, tmp_path: Path
    ) -> None:
        engine, reports = RecordingSim(), Reports()
        digest = hashlib.sha256(b"GGUF" + b"\0" * 4096).hexdigest()
        async with (
            WeightsCache(tmp_path / "weights") as cache,
            Supervisor(
                {"sim": engine}, reports, ready_timeout_s=WAIT_S, weights=cache, state_dir=tmp_path
            ) as supervisor,
        ):
            await supervisor.start(
                pb.StartShard(
                    shard_id="s1", model="m", engine="sim", source=origin, sha256={"tiny.gguf": digest}
                )
            )
            await reports.wait_for("ready")
            downloading = [s.detail for s in reports.statuses if s.state == "downloading"]
            assert "downloading tiny.gguf: 0.0 of 4.1 KB" in downloading
            (spec,) = engine.specs
            assert (await asyncio.to_thread(Path(spec.model_path).read_bytes)).startswith(b"GGUF")
            assert supervisor.weights_in_use() == {origin}
            _, kept = await supervisor.remove_weights([origin])
            assert kept and cache.path_of(origin) is not None

    async def test_weights_that_fail_their_checksum_fail_the_shard_and_start_nothing(
        self, origin: str, tmp_path: Path
    ) -> None:
        engine, reports = RecordingSim(), Reports()
        async with (
            WeightsCache(tmp_path / "weights") as cache,
            Supervisor({"sim": engine}, reports, weights=cache, state_dir=tmp_path) as supervisor,
        ):
            await supervisor.start(
                pb.StartShard(
                    shard_id="s1", model="m", engine="sim", source=origin, sha256={"tiny.gguf": "ab" * 32}
                )
            )
            failed = await reports.wait_for("failed")
            assert "sha256 does not match the pin (expected " in failed.detail
            assert engine.specs == []
            assert cache.present() == []
