"""On-demand models' scale in the store: the leader's decisions, and the gateways' requests, which only
move forward."""

from __future__ import annotations

from llmgw.store import Store
from llmgw.store.scale import StoredScale, forget_scales, note_requests, read_scales, write_decisions


async def test_a_decision_is_read_back_as_it_was_written(store: Store) -> None:
    decision = StoredScale(
        model="tiny-chat",
        replicas=2,
        reason="2 replicas: 14.0 in flight per replica for 60 s, target 8",
        decided_at=1000.5,
        last_request=990.0,
        eviction="stopped an idle replica of chat-a on n1 (last used 100 s ago) to make room for tiny-chat",
        cold_start='{"total_s": 2.5}',
    )
    await write_decisions(store, [decision])
    assert await read_scales(store) == [decision]


async def test_a_gateways_requests_only_move_the_times_forward(store: Store) -> None:
    await note_requests(store, {"tiny-chat": 100.0}, {"tiny-chat": 90.0})
    await note_requests(store, {"tiny-chat": 50.0, "other": 7.0}, {})
    rows = {r.model: r for r in await read_scales(store)}
    assert (rows["tiny-chat"].last_request, rows["tiny-chat"].wanted_at) == (100.0, 90.0)
    # Written by gateways only: no decision yet.
    assert (rows["other"].reason, rows["other"].last_request) == ("", 7.0)


async def test_the_leaders_decision_keeps_a_later_request_a_gateway_wrote(store: Store) -> None:
    await note_requests(store, {"tiny-chat": 200.0}, {})
    await write_decisions(store, [StoredScale("tiny-chat", 1, "a request came", 150.0, last_request=150.0)])
    (row,) = await read_scales(store)
    assert (row.replicas, row.last_request) == (1, 200.0)


async def test_models_no_longer_on_demand_are_forgotten(store: Store) -> None:
    await note_requests(store, {"a": 1.0, "b": 2.0}, {})
    await forget_scales(store, ["b"])
    assert [r.model for r in await read_scales(store)] == ["b"]
