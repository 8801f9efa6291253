"""What the server keeps for long is kept out of the garbage collector's full passes."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Iterator

import pytest

from llmgw import heap


@pytest.fixture
def unfrozen() -> Iterator[None]:
    gc.unfreeze()
    yield
    gc.unfreeze()


def test_freezing_keeps_what_is_alive_now_out_of_collections(unfrozen):
    kept = [object() for _ in range(1000)]
    heap.freeze()
    assert gc.get_freeze_count() >= len(kept)


async def test_a_long_burst_of_registrations_is_frozen_as_it_goes_and_once_it_has_gone_quiet(monkeypatch):
    # Each period of the watcher, as the count of registrations stands at its end: a burst over
    # three periods, then quiet.
    counts = iter([3, 40, 90, 90, 90, 90])
    registrations = 0
    frozen_at: list[int] = []
    periods = 0

    async def period(_: float) -> None:
        nonlocal registrations, periods
        periods += 1
        try:
            registrations = next(counts)
        except StopIteration:
            raise asyncio.CancelledError from None

    monkeypatch.setattr(heap, "sleep", period)
    monkeypatch.setattr(heap, "freeze", lambda: frozen_at.append(periods))
    with pytest.raises(asyncio.CancelledError):
        await heap.freeze_after_registrations(lambda: registrations)
    # Each period of the burst (full collections would otherwise walk all it built, again and
    # again), once when it has gone quiet, and not again while nothing new registers.
    assert frozen_at == [1, 2, 3, 4]


async def test_nothing_is_frozen_while_no_node_registers(monkeypatch):
    frozen: list[None] = []
    periods = iter(range(20))

    async def period(_: float) -> None:
        if next(periods, None) is None:
            raise asyncio.CancelledError

    monkeypatch.setattr(heap, "sleep", period)
    monkeypatch.setattr(heap, "freeze", lambda: frozen.append(None))
    with pytest.raises(asyncio.CancelledError):
        await heap.freeze_after_registrations(lambda: 7)
    assert frozen == []
