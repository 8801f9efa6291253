"""A disk that fills during a download, on a real tiny filesystem: the partial file goes, the space is told.

The weights cache is put on a tmpfs of 1 MiB mounted for the test (which needs
root; without it the tests skip, the one skip tests/needs.py allows) and asked for a 3 MB file.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from aiohttp import web

from llmgw.agent.discovery.node import NodeReport
from llmgw.agent.weights import PART, WeightsCache, WeightsError, cache_key
from llmgw.config import AgentConfig
from llmgw.control.inventory import Replica
from llmgw.download import human_bytes
from llmgw.proto.llmgw import v1 as pb
from tests import needs
from tests.agent.test_client_node_changes import GB, Certs, FakeDisk, certs, connected_agent  # noqa: F401
from tests.waiting import eventually

BIG = b"\x01" * 3_000_000
MEDIUM = b"\x02" * 500_000


@pytest.fixture
def tiny_disk(tmp_path: Path) -> Iterator[Path]:
    """A 1 MiB tmpfs under tmp_path, unmounted at teardown."""
    needs.root("mounting a tiny tmpfs for the weights cache")
    mount = tmp_path / "disk"
    mount.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount)],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        pytest.fail(
            f"root cannot mount a tmpfs here: {done.stderr.strip() or done.returncode}", pytrace=False
        )
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


@pytest.fixture
async def origin() -> AsyncIterator[str]:
    """Serves /big.gguf (3 MB), /medium.gguf (500 KB) and /small.gguf; yields the base URL."""

    async def serve(request: web.Request) -> web.Response:
        body = {"big": BIG, "medium": MEDIUM}.get(request.match_info["name"], b"GGUF" + b"\0" * 100)
        return web.Response(body=body)

    app = web.Application()
    app.router.add_get("/{name}.gguf", serve)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    await runner.cleanup()


class TestWeightsCache:
    async def test_a_download_the_disk_cannot_hold_removes_its_partial_file_and_says_how_much_more_it_needs(
        self, tiny_disk: Path, origin: str
    ) -> None:
        told: list[str] = []
        source = f"{origin}/big.gguf"
        async with WeightsCache(
            tiny_disk / "weights", retry_base_s=0, on_disk_full=lambda: told.append("full")
        ) as cache:
            with pytest.raises(WeightsError) as refused:
                await cache.fetch(source, {})
            free = shutil.disk_usage(tiny_disk).free
            assert str(refused.value) == (
                f"weights big.gguf: no space left on {tiny_disk} "
                f"(needs {human_bytes(len(BIG) - free, None)} more); the partial file was removed; "
                "`llmgw ctl weights collect` removes weights no model uses"
            )
            assert not (tiny_disk / "weights" / cache_key(source) / ("big.gguf" + PART)).exists()
            assert told == ["full"]
            # The space is free again: a small model's weights still fit.
            small = await cache.fetch(f"{origin}/small.gguf", {})
            assert small.read_bytes().startswith(b"GGUF")

    async def test_a_directory_too_big_for_the_disk_is_refused_before_downloading(
        self, tiny_disk: Path, tmp_path: Path
    ) -> None:
        async def listing(_: web.Request) -> web.Response:
            return web.json_response({"files": [{"path": "a.bin", "size": 3_000_000}]})

        app = web.Application()
        app.router.add_get("/d/", listing)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        try:
            async with WeightsCache(tiny_disk / "weights", retry_base_s=0) as cache:
                with pytest.raises(WeightsError) as refused:
                    await cache.fetch(f"http://127.0.0.1:{runner.addresses[0][1]}/d/", {})
            assert str(refused.value).startswith(f"weights a.bin: no space left on {tiny_disk} (needs ")
        finally:
            await runner.cleanup()


async def test_a_small_disk_filling_up_is_told_in_a_heartbeat(
    certs: Certs,  # noqa: F811
    tmp_path: Path,
    tiny_disk: Path,
    origin: str,
) -> None:
    """Free space was sent only when it moved by a whole GB: a small disk filling up was never heard."""
    async with connected_agent(certs, tmp_path, os.statvfs, state_dir=tiny_disk) as agent:
        (before,) = agent.node().storage
        assert before.path == str(tiny_disk / "weights")
        start = pb.StartShard(shard_id="s0", model="m", engine="sim", source=f"{origin}/medium.gguf")
        await agent.inventory.send("n1", pb.ControlMessage(start=start))
        await eventually(
            lambda: agent.node().storage[0].free_bytes < before.free_bytes - 400_000, within_s=30
        )
        assert agent.inventory.registrations == 1


async def test_a_full_disk_fails_the_shard_in_words_and_the_free_space_is_sent_at_once(
    certs: Certs,  # noqa: F811
    tmp_path: Path,
    tiny_disk: Path,
    origin: str,
) -> None:
    """Over the real stream, with the node's periodic refresh and heartbeats an hour apart: the shard's
    failure names the disk, and the free space (less the weights fetched since registering) follows it
    at once, not at the next refresh or registration."""
    async with connected_agent(
        certs, tmp_path, os.statvfs, state_dir=tiny_disk, heartbeat_interval_s=3600
    ) as agent:
        (before,) = agent.node().storage
        medium = pb.StartShard(shard_id="s0", model="medium", engine="sim", source=f"{origin}/medium.gguf")
        await agent.inventory.send("n1", pb.ControlMessage(start=medium))
        # Fetched and started: its weights are on the disk now, and nothing has told the server so.
        await eventually(lambda: agent.inventory.ready_endpoints("medium"), within_s=30)
        big = pb.StartShard(shard_id="s1", model="big", engine="sim", source=f"{origin}/big.gguf")
        await agent.inventory.send("n1", pb.ControlMessage(start=big))

        def failed() -> Replica | None:
            return next((r for r in agent.inventory.replicas("big") if r.state == "failed"), None)

        await eventually(failed, within_s=30)
        replica = failed()
        assert replica is not None
        free = shutil.disk_usage(tiny_disk).free
        assert replica.detail.startswith(
            f"weights big.gguf: no space left on {tiny_disk} "
            f"(needs {human_bytes(len(BIG) - free, None)} more)"
        )
        await eventually(lambda: abs(agent.node().storage[0].free_bytes - free) < 16 * 1024, within_s=30)
        assert agent.node().storage[0].free_bytes < before.free_bytes - 400_000
        assert agent.inventory.registrations == 1


async def test_a_disk_changed_is_read_again_at_once_not_at_the_next_interval(tmp_path: Path) -> None:
    disk = FakeDisk(50 * GB)
    changed = asyncio.Event()
    report = NodeReport(
        AgentConfig(node_id="n1", state_dir=str(tmp_path)),
        infiniband=tmp_path / "none",
        statvfs=disk,
        disk_changed=changed,
    )
    await report.refresh()
    report.fill_register(pb.Register())
    async with asyncio.TaskGroup() as tasks:
        run = tasks.create_task(report.run(interval_s=3600))
        disk.set_free(1 * GB)
        changed.set()
        await asyncio.wait_for(report.changed.wait(), 10)
        assert [s.free_bytes for s in report.storage] == [1 * GB // 4096 * 4096]
        beat = report.fill_heartbeat(pb.Heartbeat())
        assert beat.storage_changed
        run.cancel()
