"""On-demand models' scale, as the leader decided it and as the gateways saw their requests.

The leader writes its decisions (replicas, why, the last eviction, the last cold start measured);
every gateway, the standbys' included, writes when it last had a request for a model and when it
last held one for want of a replica. Times are the wall clock in seconds, so that another server
reads them after a restart or a takeover. A gateway's times only ever move forward: two
gateways writing at once keep the later.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import attrs

from llmgw.store.base import Store


@attrs.frozen
class StoredScale:
    model: str
    replicas: int
    # The leader's reason, in words; "" for a model only gateways wrote of (no decision yet).
    reason: str
    decided_at: float
    last_request: float = 0.0
    wanted_at: float = 0.0
    eviction: str = ""
    # The last cold start measured, as the control plane writes it (JSON); "" for none.
    cold_start: str = ""


_LATER = "CASE WHEN excluded.{0} > model_scale.{0} THEN excluded.{0} ELSE model_scale.{0} END"


async def read_scales(store: Store) -> list[StoredScale]:
    rows = await store.fetch_all(
        "SELECT model, replicas, reason, decided_at, last_request, wanted_at, eviction, cold_start "
        "FROM model_scale ORDER BY model"
    )
    return [
        StoredScale(
            model=row["model"],
            replicas=int(row["replicas"]),
            reason=row["reason"],
            decided_at=float(row["decided_at"]),
            last_request=float(row["last_request"]),
            wanted_at=float(row["wanted_at"]),
            eviction=row["eviction"],
            cold_start=row["cold_start"],
        )
        for row in rows
    ]


async def write_decisions(store: Store, decisions: Sequence[StoredScale]) -> None:
    """The leader's decisions; each model's last request is kept if a gateway wrote a later one."""
    if not decisions:
        return
    async with store.transaction() as db:
        await db.execute_many(
            "INSERT INTO model_scale (model, replicas, reason, decided_at, last_request, wanted_at, "
            "eviction, cold_start) VALUES (?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (model) DO UPDATE SET "
            "replicas = excluded.replicas, reason = excluded.reason, decided_at = excluded.decided_at, "
            f"last_request = {_LATER.format('last_request')}, eviction = excluded.eviction, "
            "cold_start = excluded.cold_start",
            [
                (
                    d.model,
                    d.replicas,
                    d.reason,
                    d.decided_at,
                    d.last_request,
                    d.wanted_at,
                    d.eviction,
                    d.cold_start,
                )
                for d in decisions
            ],
        )


async def note_requests(store: Store, last: Mapping[str, float], wanted: Mapping[str, float]) -> None:
    """A gateway's last request per model, and when it last held one for want of a replica."""
    models = sorted(last.keys() | wanted.keys())
    if not models:
        return
    async with store.transaction() as db:
        await db.execute_many(
            "INSERT INTO model_scale (model, replicas, reason, decided_at, last_request, wanted_at) "
            "VALUES (?, 0, '', 0, ?, ?) ON CONFLICT (model) DO UPDATE SET "
            f"last_request = {_LATER.format('last_request')}, wanted_at = {_LATER.format('wanted_at')}",
            [(m, last.get(m, 0.0), wanted.get(m, 0.0)) for m in models],
        )


async def forget_scales(store: Store, keep: Sequence[str]) -> None:
    """Drop the rows of models no longer on demand (removed, or given a fixed `replicas`)."""
    rows = await store.fetch_all("SELECT model FROM model_scale")
    gone = [(row["model"],) for row in rows if row["model"] not in set(keep)]
    if gone:
        async with store.transaction() as db:
            await db.execute_many("DELETE FROM model_scale WHERE model = ?", gone)
