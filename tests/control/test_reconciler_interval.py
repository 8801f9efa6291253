"""The reconciler's own timer: a pass every control.interval_s, even when nothing tells it to look."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING

import betterproto
import pytest

from llmgw.catalog import Catalog
from llmgw.config import ControlConfig, ModelConfig, ProfileConfig, ServerConfig
from llmgw.control.inventory import Inventory, Link
from llmgw.control.reconciler import Reconciler
from llmgw.proto.llmgw import v1 as pb

if TYPE_CHECKING:
    from conftest import Eventually


class CountingReconciler(Reconciler):
    """A reconciler that counts its passes."""

    passes = 0

    async def reconcile(self) -> None:
        self.passes += 1
        await super().reconcile()


@contextlib.asynccontextmanager
async def running(reconciler: Reconciler) -> AsyncIterator[None]:
    task = asyncio.create_task(reconciler.run())
    try:
        yield
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task


def kinds(link: Link) -> list[str]:
    out: list[str] = []
    while not link.outbox.empty():
        out.append(betterproto.which_one_of(link.outbox.get_nowait(), "kind")[0])
    return out


async def test_passes_keep_coming_at_the_interval_with_no_change_to_wake_them(eventually: Eventually) -> None:
    inventory = Inventory(grace_s=15)
    cfg = ServerConfig(control=ControlConfig(interval_s=0.01))
    reconciler = CountingReconciler(cfg, inventory, Catalog(cfg), in_flight={})
    async with running(reconciler):
        await eventually(lambda: reconciler.passes >= 1)
        # Nothing in the catalog and no node: no pass has anything to change, so none sets the event.
        assert not inventory.changed.is_set()
        await eventually(lambda: reconciler.passes >= 5)
        assert not inventory.changed.is_set()


async def test_a_model_backing_off_is_retried_by_a_timed_pass_once_its_wait_is_over(
    eventually: Eventually,
) -> None:
    """Nothing in the inventory changes when a backoff ends: only the timer brings the retry."""
    now = [100.0]
    clock: Callable[[], float] = lambda: now[0]  # noqa: E731
    inventory = Inventory(grace_s=15, clock=clock)
    link = inventory.attach(pb.Register(node_id="n1", engine_versions={"sim": "1"}, engines_probed=True))
    inventory.shard_status(
        "n1", pb.ShardStatus(shard_id="s1", model="sim-chat", engine="sim", state="failed")
    )
    cfg = ServerConfig(
        models=[ModelConfig(name="sim-chat", replicas=1, profiles=[ProfileConfig(engine="sim")])],
        control=ControlConfig(interval_s=0.01, base_backoff_s=60.0),
    )
    reconciler = Reconciler(cfg, inventory, Catalog(cfg), in_flight={}, clock=clock)
    async with running(reconciler):
        await eventually(lambda: "backing off" in inventory.why_no_ready("sim-chat"))
        # The pass that stopped the failed shard set the event, and the pass it woke found nothing to
        # change: from here on, no event comes.
        await eventually(lambda: not inventory.changed.is_set())
        assert kinds(link) == ["stop"]
        now[0] += 61.0
        await eventually(lambda: inventory.replicas("sim-chat"))
    assert kinds(link) == ["start"]
