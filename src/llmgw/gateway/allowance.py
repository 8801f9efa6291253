"""Limits and budgets exact across gateways that share one PostgreSQL: each holds leases of allowance.

Counting every request in PostgreSQL would put a database round trip on the
request path. Instead each gateway (a holder) leases part of a scope's
allowance and spends it in memory; PostgreSQL only records how much each
holder holds, in a row per scope, kind and holder:

- requests and tokens (rpm, tpm): a unit is busy for the 60 s after the
  request that spent it was admitted, exactly as in the one-gateway sliding
  window. A holder admits while what it has busy stays within its lease, and
  the leases of all holders together never exceed the limit, so in any
  60 seconds no more than the limit is admitted across every gateway.
- money (budgets): a holder's lease covers what it has spent this period and
  what its requests in flight reserved; the rows of a period, and one row for
  what was spent before the first lease of the period, never exceed the
  budget.

Claiming is one statement under a lock on the scope (an advisory lock for the
transaction): it sets this holder's row to what it asks for, but never past
the limit less the live rows of the others. The same statement returns
allowance (a smaller row) and renews the lease. A holder asks for more in the
background before it runs out (twice what it spent in the last interval), on
demand when a request finds its lease short (the request waits for the claim,
then takes half of what nobody holds, so the last units go one at a time
rather than sitting with one gateway), and gives back what it does not use at
every renewal.

A rate row lives for the window plus TERM_S after it was last renewed, and a
holder spends its lease only for TERM_S after it asked: a holder that dies
(its process killed, its connection gone) leaves its row to run out by itself
once everything it admitted has left the window. Its allowance is lost for at
most the window plus TERM_S; never counted twice. A budget's rows live until the
period ends: a dead holder's spending still counts, and what it held unspent
is lost until the period ends (at most the block it held).

When PostgreSQL cannot be reached (a claim fails, or takes over
CLAIM_TIMEOUT_S), the gateway counts alone, as one gateway does, rather than
refuse: the one time the gateways together may admit more than a limit. The
renewal loop asks PostgreSQL again every interval, and once it answers writes
what was admitted meanwhile into this holder's rows.
"""

from __future__ import annotations

import asyncio
import math
import os
import secrets
import socket
import time
from collections.abc import Callable

import asyncpg
import structlog

log = structlog.get_logger(__name__)

# How long a holder may spend a lease after asking PostgreSQL for it: it must
# renew within this, or admit nothing more on it. Its row lives this long past
# the window, so that a holder that died mid-term still has every request it
# admitted counted while it stays in the window.
TERM_S = 10.0
# The background renewal: often enough that a busy lease never lapses.
RENEW_S = 2.0
# A claim that takes longer is given up (PostgreSQL unreachable): a request must not wait on a
# connection to an address that drops packets.
CLAIM_TIMEOUT_S = 2.0
# A live holder rewrites its row's frees_at within a renewal of it passing (the round may take a
# claim's timeout); one left unrenewed longer is a dead holder's, whose units come back only when
# the row lapses.
_STALE_S = 2 * RENEW_S + CLAIM_TIMEOUT_S
# An on-demand claim takes this share of what nobody holds, besides what the
# waiting requests need: fewer round trips under load, and, as allowance runs
# low, smaller blocks so that the last units are not stranded with one holder.
SHARE = 0.5
# A budget's rows outlive their period by this, so that a gateway whose clock is
# behind still counts them until it too has moved on to the next period.
_PERIOD_MARGIN_S = 3600.0
# The row that counts what a period's budget spent before its first lease.
BEFORE = "spent before the leases"

# Seconds of the database's clock: every holder's rows live and lapse by the same one.
_NOW = "extract(epoch FROM clock_timestamp())"

# A lock per scope and kind: claims for one serialise, claims for others run
# side by side. A statement of its own, so that the claim after it, in a fresh
# snapshot, sees every row the previous holder of the lock committed.
_LOCK = "SELECT pg_advisory_xact_lock(hashtextextended('llmgw allowance ' || $1 || ' ' || $2, 0))"

# $1 scope, $2 kind, $3 holder, $4 limit, $5 keep (the row never drops below
# it: allowance this holder may already be spending), $6 ask (what it wants to
# hold), $7 share of the rest, taken in whole steps of $8 (what one request
# needs: no sliver too small for a request stranded with this holder), $9
# seconds the row lives, $10 what this holder has busy once the claim is spent,
# $11 seconds until the first of it leaves the window (NULL: none busy).
#
# Each row also says when it next has a unit to give back (frees_at): now when
# it holds more than is busy, else when its first busy unit leaves the window.
# The claim returns, in seconds from now, when the first of the others' rows
# gives one back: at its holder's next renewal after frees_at ($12, the renewal
# interval), or when it lapses, for a row whose frees_at has gone unrenewed
# past $13 (its holder dead or cut off). A refusal's Retry-After is that, or
# this holder's own first unit leaving, whichever comes first: a request is not
# admitted sooner, since a unit held by one holder is claimed by no other.
_CLAIM = f"""
WITH others AS (
    SELECT units, frees_at, expires_at FROM allowance_leases
    WHERE scope = $1 AND kind = $2 AND holder <> $3 AND expires_at > {_NOW}
), room AS (
    SELECT $4::float8 - coalesce(sum(units), 0) AS units,
        min(CASE WHEN frees_at >= {_NOW} - $13::float8
            THEN least(greatest(frees_at, {_NOW}) + $12::float8, expires_at)
            ELSE expires_at END) FILTER (WHERE units > 0) - {_NOW} AS frees_in
    FROM others
), wanted AS (
    SELECT room.units AS room, room.frees_in,
        greatest(room.units - $6::float8, 0) * $7::float8 AS extra FROM room
), granted AS (
    SELECT greatest($5::float8, least(room, $6::float8 + floor(extra / $8::float8) * $8::float8)) AS units
    FROM wanted
)
INSERT INTO allowance_leases (scope, kind, holder, units, expires_at, frees_at)
SELECT $1, $2, $3, granted.units, {_NOW} + $9::float8,
    CASE WHEN granted.units > $10::float8 THEN {_NOW} ELSE {_NOW} + $11::float8 END
FROM granted
ON CONFLICT (scope, kind, holder) DO UPDATE
SET units = excluded.units, expires_at = excluded.expires_at, frees_at = excluded.frees_at
RETURNING units, (SELECT room FROM wanted), (SELECT frees_in FROM wanted)
"""

_BEFORE = f"""
INSERT INTO allowance_leases (scope, kind, holder, units, expires_at)
VALUES ($1, $2, $3, $4, {_NOW} + $5::float8)
ON CONFLICT DO NOTHING
"""

# Rows that ran out long ago: a dead holder's, a past period's.
_FORGET = f"DELETE FROM allowance_leases WHERE expires_at < {_NOW} - 3600"


class StoreUnreachable(Exception):
    """PostgreSQL could not be asked for allowance; the sentence says why."""


class Lease:
    """What this gateway holds of one scope's allowance of one kind."""

    __slots__ = (
        "before",
        "busy",
        "dry",
        "ends",
        "frees",
        "kind",
        "limit",
        "lock",
        "others_free_at",
        "scope",
        "spent",
        "told_spare",
        "units",
        "until",
    )

    def __init__(
        self,
        scope: str,
        kind: str,
        busy: Callable[[], float],
        *,
        ends: float | None = None,
        before: Callable[[], float] | None = None,
        frees: Callable[[], float | None] = lambda: None,
    ) -> None:
        self.scope = scope
        self.kind = kind
        # What this gateway has in use now: requests or tokens in the window, money spent and reserved.
        self.busy = busy
        # A budget's lease: the wall-clock second its period ends (None: a rate lease, which lives
        # TERM_S past its renewal; inf: a total budget).
        self.ends = ends
        # A budget's lease: what the store says the period spent so far, for the period's first claim.
        self.before = before
        # A rate lease: seconds until the first unit busy here leaves the window (None: none busy).
        self.frees = frees
        self.limit = 0.0
        # What this gateway's row holds, as far as it knows: never more than the row.
        self.units = 0.0
        # The clock's second after which the lease may no longer be spent until renewed.
        self.until = -math.inf if ends is None else math.inf
        # Spent since the last renewal: how fast it goes, to ask for more before it runs out.
        self.spent = 0.0
        # The last claim found nothing left that no other holder holds.
        self.dry = False
        # The clock's second at which, as the last claim saw the store, another holder may first give
        # a unit back (None: no other holder holds any).
        self.others_free_at: float | None = None
        # A rate lease whose row says it has a unit to give back now: once requests spend it, the row
        # is rewritten (Allowance.filled), or the others would tell their clients to retry too soon.
        self.told_spare = False
        self.lock = asyncio.Lock()

    def fits(self, busy: float, need: float, now: float) -> bool:
        """Whether need more fits in the lease besides what is busy."""
        return now < self.until and busy + need <= self.units


class Allowance:
    """This gateway's leases: claimed, renewed and returned through PostgreSQL."""

    def __init__(
        self,
        pool: asyncpg.Pool,
        *,
        holder: str | None = None,
        window_s: float = 60.0,
        term_s: float = TERM_S,
    ) -> None:
        self._pool = pool
        # Unique to this process: a restarted gateway never takes over the row of the one before,
        # whose spending it does not know.
        self.holder = holder or f"{socket.gethostname()}/{os.getpid()}/{secrets.token_hex(4)}"
        self._window_s = window_s
        self._term_s = term_s
        # The leases that have a row to renew or give back.
        self._held: dict[tuple[str, str], Lease] = {}
        # Leases whose rows say they have a unit to spare, and no longer have: told by _tell_filled().
        self._filled: list[Lease] = []
        self._wake = asyncio.Event()
        self._failing = False

    def lease(
        self,
        scope: str,
        kind: str,
        busy: Callable[[], float],
        *,
        ends: float | None = None,
        before: Callable[[], float] | None = None,
        frees: Callable[[], float | None] = lambda: None,
    ) -> Lease:
        return Lease(scope, kind, busy, ends=ends, before=before, frees=frees)

    async def claim(self, lease: Lease, need: float) -> None:
        """Ask for enough to spend need more now, and a share of the rest; one claim at a time.

        A request that finds a claim in flight waits for it and lets its caller look again rather
        than asking twice: the one claim usually brought enough for both.
        """
        seen = lease.lock.locked()
        async with lease.lock:
            if seen:
                return
            busy = lease.busy()
            await self._set(lease, busy + need, SHARE, need, need)

    async def renew(self, lease: Lease) -> None:
        """Keep what was busy plus twice what went in the last interval; give back the rest."""
        if lease.lock.locked():
            return
        async with lease.lock:
            busy = lease.busy()
            ask = busy + 2 * lease.spent
            lease.spent = 0.0
            await self._set(lease, ask, 0.0, 1.0)

    async def _set(self, lease: Lease, ask: float, share: float, step: float, need: float = 0.0) -> None:
        """Set this holder's row to ask (and share of the rest, in steps); need: what a waiting request
        spends of it at once."""
        now = time.monotonic()
        busy = lease.busy()
        # After a lapse only what is busy may still be counted in the row; the rest may be gone.
        valid = lease.units if now < lease.until else busy
        keep = max(busy, min(valid, ask))
        # Giving back binds at once: what may be spent while the statement runs is what the row keeps.
        lease.units = min(lease.units, keep)
        if lease.ends is None:
            ttl = self._window_s + self._term_s
        else:
            ttl = lease.ends - time.time() + _PERIOD_MARGIN_S
        sent = time.monotonic()
        try:
            async with asyncio.timeout(CLAIM_TIMEOUT_S), self._pool.acquire() as conn, conn.transaction():
                await conn.execute(_LOCK, lease.scope, lease.kind)
                if lease.before is not None:
                    # The period's first claim anywhere: what the store counts as spent already binds.
                    await conn.execute(_BEFORE, lease.scope, lease.kind, BEFORE, lease.before(), ttl)
                row = await conn.fetchrow(
                    _CLAIM,
                    lease.scope,
                    lease.kind,
                    self.holder,
                    float(lease.limit),
                    keep,
                    ask,
                    share,
                    step,
                    ttl,
                    busy + need,
                    lease.frees(),
                    RENEW_S,
                    _STALE_S,
                )
        except (asyncpg.PostgresError, asyncpg.InterfaceError, OSError, TimeoutError) as exc:
            self._unreachable(exc)
            # Renewed once PostgreSQL answers: what this gateway admits meanwhile, counting alone,
            # must reach its row before the others claim past it.
            self._held[(lease.scope, lease.kind)] = lease
            raise StoreUnreachable(str(exc) or type(exc).__name__) from exc
        lease.before = None
        assert row is not None
        units, room = float(row[0]), float(row[1])
        # Counted from the answer, not the question: the wait it makes is never shorter than the store's.
        lease.others_free_at = None if row[2] is None else time.monotonic() + float(row[2])
        lease.units = units
        lease.told_spare = lease.ends is None and units > busy + need
        if lease.ends is None:
            lease.until = sent + self._term_s
        lease.dry = units >= room
        key = (lease.scope, lease.kind)
        if units > 0:
            self._held[key] = lease
        else:
            self._held.pop(key, None)

    def held(self) -> list[Lease]:
        return list(self._held.values())

    @property
    def unreachable(self) -> bool:
        """PostgreSQL failed the last claim and has not answered since: count alone meanwhile."""
        return self._failing

    def _unreachable(self, exc: BaseException) -> None:
        if not self._failing:
            log.warning(
                "cannot reach PostgreSQL to share limits and budgets with the other gateways; this one "
                "counts them alone until it answers again, so together they may admit more than a limit",
                error=str(exc) or type(exc).__name__,
            )
        self._failing = True

    async def _answers(self) -> bool:
        """Whether PostgreSQL answers again, after a failed claim."""
        try:
            async with asyncio.timeout(CLAIM_TIMEOUT_S), self._pool.acquire() as conn:
                await conn.fetchval("SELECT 1")
        except (asyncpg.PostgresError, asyncpg.InterfaceError, OSError, TimeoutError):
            return False
        log.info("PostgreSQL answers again: limits and budgets are shared with the other gateways again")
        self._failing = False
        return True

    def filled(self, lease: Lease) -> None:
        """Requests spent the last unit of a lease whose row says it has one to spare: say it has none.

        Without it another gateway refused at the limit would tell its client to retry at this one's
        next renewal, when the unit it counted on was already in a request's hands.
        """
        lease.told_spare = False
        self._filled.append(lease)
        self._wake.set()

    async def run(self, interval_s: float = RENEW_S) -> None:
        """Renew the leases every interval; tell the store at once of those filled up."""
        async with asyncio.TaskGroup() as group:
            group.create_task(self._renew_every(interval_s))
            group.create_task(self._tell_filled())

    async def _tell_filled(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            filled, self._filled = self._filled, []
            for lease in filled:
                if self._failing or lease.lock.locked():
                    # Counted alone meanwhile; or a claim in flight writes the row anyway.
                    continue
                async with lease.lock:
                    # Its units as they are, unless they lapsed: only frees_at changes.
                    try:
                        await self._set(lease, lease.units, 0.0, 1.0)
                    except StoreUnreachable:
                        break

    async def _renew_every(self, interval_s: float) -> None:
        """Renew every lease held, give back what goes unused, forget rows long run out."""
        rounds = 0
        while True:
            await asyncio.sleep(interval_s)
            if self._failing and not await self._answers():
                continue
            for lease in self.held():
                if lease.ends is not None and time.time() >= lease.ends:
                    # A past period's budget: its rows count until they lapse; nothing more to do.
                    self._held.pop((lease.scope, lease.kind), None)
                    continue
                if lease.spent == 0 and 0 < lease.units <= lease.busy():
                    # Idle, all of it busy: nothing to give back and nothing being spent; its row
                    # outlives what is busy. A round trip per idle scope every interval spared.
                    continue
                try:
                    await self.renew(lease)
                except StoreUnreachable:
                    # Said once; admission counts alone until _answers() says otherwise.
                    break
            rounds += 1
            if rounds % 30 == 0:
                try:
                    async with self._pool.acquire() as conn:
                        await conn.execute(_FORGET)
                except (asyncpg.PostgresError, asyncpg.InterfaceError, OSError, TimeoutError):
                    pass

    async def give_back(self, within_s: float = 5.0) -> None:
        """Return all that is not busy when the gateway stops: others need not wait for its rows to lapse.

        Within within_s: a PostgreSQL that does not answer must not hold the stop.
        """
        try:
            async with asyncio.timeout(within_s):
                for lease in self.held():
                    async with lease.lock:
                        await self._set(lease, lease.busy(), 0.0, 1.0)
        except (StoreUnreachable, TimeoutError):
            log.warning("could not give back the unused allowance; it returns as its leases lapse")
