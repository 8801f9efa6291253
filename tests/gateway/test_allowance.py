"""Limits and budgets stay exact across gateways sharing one PostgreSQL: leases of allowance.

Each "gateway" here is the admission of one: a Quotas with an Allowance of its own, on a
connection pool of its own, all on one database of the throwaway cluster.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from datetime import UTC, datetime

import asyncpg
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from llmgw.catalog import Catalog
from llmgw.config import ModelConfig, ServerConfig
from llmgw.engines.sim_server import make_sim_app
from llmgw.gateway import allowance as allowance_module
from llmgw.gateway import quotas as quotas_module
from llmgw.gateway.admission import Admission
from llmgw.gateway.allowance import Allowance
from llmgw.gateway.app import make_gateway_app
from llmgw.gateway.auth import KeyCache
from llmgw.gateway.errors import ApiError
from llmgw.gateway.quotas import Quotas, Short, Ticket
from llmgw.gateway.usage import UsageRecorder
from llmgw.store import Store
from llmgw.store.keys import KeyRecord, create_key
from llmgw.store.postgres import open_postgres
from llmgw.store.quotas import Budget, Limits
from llmgw.store.scopes import Hierarchy, Org, Project, Scope, Team
from llmgw.tenancy import operations as tenancy

from ..postgres import Cluster
from ..waiting import eventually, eventually_async
from .conftest import MODEL, FakeReplicas


class Clock:
    """Stands in for the time module of gateway.quotas and gateway.allowance."""

    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now

    def time(self) -> float:
        return 1_750_000_000.0 + self.now


def _key(key_id: int, project_id: int) -> KeyRecord:
    return KeyRecord(
        id=key_id,
        name=f"k{key_id}",
        prefix=f"sk-llmgw-{key_id}",
        key_hash=str(key_id),
        created_at=datetime(2026, 1, 1, tzinfo=UTC),
        revoked_at=None,
        project_id=project_id,
    )


def _hierarchy(projects: int) -> Hierarchy:
    """One org, one team, and projects 1..projects in it."""
    return Hierarchy(
        {1: Org(1, "acme")},
        {1: Team(1, 1, "core")},
        {p: Project(p, 1, f"p{p}") for p in range(1, projects + 1)},
    )


class Gateway:
    """One gateway's admission: its quotas, its leases, its connections to the shared database."""

    def __init__(self, quotas: Quotas, allowance: Allowance, pool: asyncpg.Pool) -> None:
        self.quotas, self.allowance, self.pool = quotas, allowance, pool

    async def admit(self, key: KeyRecord, tokens: int = 10, cost: float = 0.0) -> Ticket | ApiError:
        """As the admission stage does it: in memory, and on a short lease, claim and admit again."""
        try:
            try:
                return self.quotas.admit(key, tokens, cost)
            except Short as short:
                return await self.quotas.admit_leased(key, tokens, cost, short)
        except ApiError as refusal:
            return refusal

    async def give_back(self) -> None:
        """Two renewals with nothing spent between: the second gives back all that is not busy."""
        for _ in range(2):
            for lease in self.allowance.held():
                await self.allowance.renew(lease)


Make = Callable[..., Awaitable[Gateway]]


@pytest.fixture
async def gateways(postgres_url: str) -> AsyncIterator[Make]:
    """Makes gateways on one database; closes their pools in the end."""
    pools: list[asyncpg.Pool] = []
    # The store's migrations make the leases' table, as a server's start does.
    async with open_postgres(postgres_url):
        pass

    async def make(
        hierarchy: Hierarchy, limits: Sequence[Limits] = (), budgets: Sequence[Budget] = ()
    ) -> Gateway:
        pool = await asyncpg.create_pool(postgres_url, min_size=1, max_size=3)
        pools.append(pool)
        allowance = Allowance(pool)
        quotas = Quotas(UsageRecorder(), allowance=allowance)
        quotas.replace(hierarchy, limits, budgets)
        return Gateway(quotas, allowance, pool)

    yield make
    for pool in reversed(pools):
        pool.terminate()


async def _burst(
    gateways: Sequence[Gateway], keys: Sequence[KeyRecord], count: int, tokens: int = 10, cost: float = 0.0
) -> list[Ticket | ApiError]:
    """count requests at once, split round-robin over the gateways and the keys."""
    return await asyncio.gather(
        *(gateways[i % len(gateways)].admit(keys[i % len(keys)], tokens, cost) for i in range(count))
    )


def _admitted(results: Sequence[Ticket | ApiError]) -> int:
    return sum(1 for r in results if isinstance(r, Ticket))


async def _granted(pool: asyncpg.Pool, scope: str, kind: str) -> float:
    """What every live row of a scope's kind holds together."""
    async with pool.acquire() as conn:
        value = await conn.fetchval(
            "SELECT coalesce(sum(units), 0) FROM allowance_leases "
            "WHERE scope = $1 AND kind = $2 AND expires_at > extract(epoch FROM clock_timestamp())",
            scope,
            kind,
        )
    return float(value)


async def _until_granted(
    pool: asyncpg.Pool, scope: str, kind: str, units: float, within_s: float = 10.0
) -> None:
    """Wait until the live rows of a scope's kind hold units together."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within_s
    while (held := await _granted(pool, scope, kind)) != units:
        assert loop.time() < deadline, f"the rows hold {held}, not {units}"
        await asyncio.sleep(0.01)


class TestRequestsPerMinute:
    @pytest.mark.parametrize("holders", [2, 3])
    async def test_200_concurrent_requests_split_over_gateways_at_rpm_60_admit_exactly_60(
        self, gateways: Make, holders: int
    ) -> None:
        limits = [Limits(Scope("project", 1), rpm=60, tpm=None)]
        fleet = [await gateways(_hierarchy(1), limits) for _ in range(holders)]
        results = await _burst(fleet, [_key(1, 1), _key(2, 1)], 200)
        assert _admitted(results) == 60
        refusals = [r for r in results if isinstance(r, ApiError)]
        assert len(refusals) == 140
        assert all(r.status == 429 for r in refusals)
        assert all("rate limit reached for project 'p1'" in r.message for r in refusals)
        assert all("60 requests per minute" in r.message for r in refusals)
        # What every gateway holds together never passes the limit.
        assert await _granted(fleet[0].pool, "project:1", "requests") <= 60

    async def test_a_gateway_whose_lease_is_empty_waits_for_the_claim_and_takes_what_another_left(
        self, gateways: Make
    ) -> None:
        limits = [Limits(Scope("project", 1), rpm=60, tpm=None)]
        first, second = await gateways(_hierarchy(1), limits), await gateways(_hierarchy(1), limits)
        assert _admitted(await _burst([first], [_key(1, 1)], 25)) == 25
        # The first gives back what it does not use at its renewals: the second gets all the rest.
        await first.give_back()
        assert _admitted(await _burst([second], [_key(1, 1)], 100)) == 35
        assert _admitted(await _burst([first, second], [_key(1, 1)], 10)) == 0

    async def test_in_the_background_a_gateway_gives_back_what_it_does_not_use(self, gateways: Make) -> None:
        limits = [Limits(Scope("project", 1), rpm=60, tpm=None)]
        first, second = await gateways(_hierarchy(1), limits), await gateways(_hierarchy(1), limits)
        assert _admitted(await _burst([first], [_key(1, 1)], 25)) == 25
        renewing = asyncio.create_task(first.allowance.run(interval_s=0.01))
        try:
            # It may first take more, at the pace it spent; idle, it keeps only what is busy.
            await _until_granted(first.pool, "project:1", "requests", 25)
        finally:
            renewing.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await renewing
        assert _admitted(await _burst([second], [_key(1, 1)], 100)) == 35

    async def test_windows_rolling_over_mid_burst_admit_the_limit_in_each_60_seconds_and_no_more(
        self, gateways: Make, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        clock = Clock()
        monkeypatch.setattr(quotas_module, "time", clock)
        monkeypatch.setattr(allowance_module, "time", clock)
        limits = [Limits(Scope("project", 1), rpm=30, tpm=None)]
        fleet = [await gateways(_hierarchy(1), limits) for _ in range(2)]
        keys = [_key(1, 1)]
        admitted_at: list[float] = []
        for _ in range(12):
            # A burst every 20 s: each sees some of the requests of the minute before leave the window.
            results = await _burst(fleet, keys, 20)
            admitted_at += [clock.now] * _admitted(results)
            for gateway in fleet:
                await gateway.give_back()
            clock.now += 20
        # In any 60 seconds, never more than 30; and the allowance was used, not stranded.
        for start in admitted_at:
            assert sum(1 for t in admitted_at if start <= t < start + 60) <= 30
        assert len(admitted_at) >= 30 * 4 - 10


async def _advance(clock: Clock, pool: asyncpg.Pool, seconds: float) -> None:
    """The gateways' clock moves on, and the rows' seconds of the database's clock with it."""
    clock.now += seconds
    async with pool.acquire() as conn:
        await conn.execute(
            "UPDATE allowance_leases SET expires_at = expires_at - $1, frees_at = frees_at - $1", seconds
        )


async def _frees_in(pool: asyncpg.Pool) -> float | None:
    """Seconds until the first live row with units frees one, as the rows say."""
    async with pool.acquire() as conn:
        value = await conn.fetchval(
            "SELECT min(frees_at) - extract(epoch FROM clock_timestamp()) FROM allowance_leases "
            "WHERE units > 0 AND expires_at > extract(epoch FROM clock_timestamp())"
        )
    return None if value is None else float(value)


class TestRetryAfterAtTheSharedLimit:
    """A refusal where the others hold the rest says when a request would really be admitted."""

    @staticmethod
    def _retry_after(refusal: Ticket | ApiError) -> int:
        assert isinstance(refusal, ApiError) and refusal.status == 429, refusal
        assert refusal.headers is not None
        seconds = int(refusal.headers["Retry-After"])
        assert f"try again in {seconds} s" in refusal.message
        return seconds

    async def test_a_gateway_holding_nothing_says_when_the_others_first_request_leaves_the_window(
        self, gateways: Make, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        clock = Clock()
        monkeypatch.setattr(quotas_module, "time", clock)
        monkeypatch.setattr(allowance_module, "time", clock)
        limits = [Limits(Scope("project", 1), rpm=5, tpm=None)]
        first, second = await gateways(_hierarchy(1), limits), await gateways(_hierarchy(1), limits)
        # Renewals never come: only the telling of a lease filled up.
        telling = asyncio.create_task(first.allowance.run(interval_s=3600))
        try:
            # The first claim takes a unit to spare, and its row says so; the requests after spend it.
            assert _admitted(await _burst([first], [_key(1, 1)], 1)) == 1
            assert (await _frees_in(first.pool) or 0) <= 0
            for _ in range(4):
                assert _admitted(await _burst([first], [_key(1, 1)], 1)) == 1

            async def told() -> bool:
                return (await _frees_in(first.pool) or 0) > 50

            await eventually_async(told)
        finally:
            telling.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await telling
        await _advance(clock, first.pool, 20)
        retry = self._retry_after(await second.admit(_key(1, 1)))
        # The first's requests leave the window 40 s from now; it gives them back at its next renewal.
        assert 40 <= retry <= 40 + allowance_module.RENEW_S + 1
        await _advance(clock, first.pool, 39)
        await first.give_back()
        assert isinstance(await second.admit(_key(1, 1)), ApiError)
        await _advance(clock, first.pool, retry - 39)
        await first.give_back()
        assert isinstance(await second.admit(_key(1, 1)), Ticket)

    async def test_gateways_that_split_the_limit_each_say_when_their_own_or_the_others_first_frees(
        self, gateways: Make, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        clock = Clock()
        monkeypatch.setattr(quotas_module, "time", clock)
        monkeypatch.setattr(allowance_module, "time", clock)
        limits = [Limits(Scope("project", 1), rpm=10, tpm=None)]
        first, second = await gateways(_hierarchy(1), limits), await gateways(_hierarchy(1), limits)
        assert _admitted(await _burst([first], [_key(1, 1)], 4)) == 4
        await first.give_back()
        await _advance(clock, first.pool, 15)
        assert _admitted(await _burst([second], [_key(1, 1)], 10)) == 6
        await second.give_back()
        await _advance(clock, first.pool, 5)
        # The first's requests leave in 40 s, the second's in 55 s: both say 40, and a renewal for
        # the one whose unit another holds.
        assert self._retry_after(await first.admit(_key(1, 1))) == 40
        retry = self._retry_after(await second.admit(_key(1, 1)))
        assert 40 <= retry <= 40 + allowance_module.RENEW_S + 1


class TestTokensAndBudgets:
    async def test_tokens_per_minute_over_two_gateways_admit_exactly_what_fits(self, gateways: Make) -> None:
        limits = [Limits(Scope("project", 1), rpm=None, tpm=10_000)]
        fleet = [await gateways(_hierarchy(1), limits) for _ in range(2)]
        results = await _burst(fleet, [_key(1, 1)], 200, tokens=150)
        # 66 requests of 150 tokens fit in 10,000; the 67th would not.
        assert _admitted(results) == 66
        refused = [r for r in results if isinstance(r, ApiError)]
        assert all("10000 tokens per minute" in r.message for r in refused)

    async def test_a_budget_over_three_gateways_is_never_overspent(self, gateways: Make) -> None:
        budgets = [Budget(Scope("project", 1), amount=1.0, period="day")]
        fleet = [await gateways(_hierarchy(1), (), budgets) for _ in range(3)]
        # Each request may cost up to 1/64: 64 of them fit.
        results = await _burst(fleet, [_key(1, 1)], 200, cost=1 / 64)
        assert _admitted(results) == 64
        refused = [r for r in results if isinstance(r, ApiError)]
        assert all(r.status == 429 and "the budget of project 'p1'" in r.message for r in refused)

    async def test_a_budget_counts_what_was_spent_before_the_leases_and_settles_to_what_was_used(
        self, gateways: Make
    ) -> None:
        budgets = [Budget(Scope("project", 1), amount=1.0, period="total")]
        first = await gateways(_hierarchy(1), (), budgets)
        # The store said a half was spent already (refresh() reads it from the usage).
        state = first.quotas._budgets[Scope("project", 1)]
        state.roll(time.time())
        state.spent = 0.5
        second = await gateways(_hierarchy(1), (), budgets)
        tickets = [t for t in await _burst([first], [_key(1, 1)], 10, cost=1 / 16) if isinstance(t, Ticket)]
        assert len(tickets) == 8
        # They used only half what they reserved: what they did not use comes back to the gateways.
        for ticket in tickets:
            first.quotas.settle(ticket, 5, 1 / 32)
        await first.give_back()
        assert _admitted(await _burst([second], [_key(1, 1)], 10, cost=1 / 16)) == 4


class TestAHolderThatDies:
    async def test_its_allowance_is_lost_only_until_its_requests_leave_the_window_and_never_counted_twice(
        self, gateways: Make, postgres: Cluster, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        clock = Clock()
        monkeypatch.setattr(quotas_module, "time", clock)
        monkeypatch.setattr(allowance_module, "time", clock)
        limits = [Limits(Scope("project", 1), rpm=60, tpm=None)]
        doomed, survivor = await gateways(_hierarchy(1), limits), await gateways(_hierarchy(1), limits)
        assert _admitted(await _burst([doomed], [_key(1, 1)], 20)) == 20
        held = await _granted(survivor.pool, "project:1", "requests")
        assert held >= 20
        # Its connections dropped: no renewal, no giving back.
        doomed.pool.terminate()
        assert _admitted(await _burst([survivor], [_key(1, 1)], 200)) == 60 - held
        # Not yet: its row lives until everything it admitted has left the window.
        clock.now += 30
        assert _admitted(await _burst([survivor], [_key(1, 1)], 200)) == 0
        # The database's clock moves on as the gateways' does: the window and the lease's term.
        async with survivor.pool.acquire() as conn:
            await conn.execute(
                "UPDATE allowance_leases SET expires_at = expires_at - $1",
                allowance_module.TERM_S + 60,
            )
        clock.now += allowance_module.TERM_S + 60
        assert _admitted(await _burst([survivor], [_key(1, 1)], 200)) == 60

    async def test_a_gateway_that_loses_postgresql_counts_alone_then_shares_what_it_admitted(
        self, gateways: Make, postgres: Cluster
    ) -> None:
        limits = [Limits(Scope("project", 1), rpm=60, tpm=None)]
        gateway = await gateways(_hierarchy(1), limits)
        await asyncio.to_thread(postgres.stop)
        try:
            # Served from memory, as the rest of the gateway is: the limit, counted by this gateway.
            assert _admitted(await _burst([gateway], [_key(1, 1)], 100)) == 60
            assert gateway.allowance.unreachable
        finally:
            await asyncio.to_thread(postgres.start)
        renewing = asyncio.create_task(gateway.allowance.run(interval_s=0.05))
        try:
            await eventually(lambda: not gateway.allowance.unreachable, within_s=30)
            # What it admitted alone reaches its row at its next renewal...
            await _until_granted(gateway.pool, "project:1", "requests", 60, within_s=30)
        finally:
            renewing.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await renewing
        # ...so another gateway finds the minute's requests taken.
        other = await gateways(_hierarchy(1), limits)
        assert _admitted(await _burst([other], [_key(1, 1)], 10)) == 0


class TestManyScopes:
    async def test_keys_projects_and_the_org_above_each_stay_exact_under_interleaved_bursts(
        self, gateways: Make
    ) -> None:
        projects = 8
        limits = [Limits(Scope("project", p), rpm=5 + p, tpm=None) for p in range(1, projects + 1)]
        limits += [Limits(Scope("key", k), rpm=3, tpm=None) for k in range(1, 4)]
        limits.append(Limits(Scope("org", 1), rpm=50, tpm=None))
        fleet = [await gateways(_hierarchy(projects), limits) for _ in range(3)]
        keys = [_key(k, 1 + (k - 1) % projects) for k in range(1, 25)]
        order = list(range(300))
        random.Random(7).shuffle(order)
        results = await asyncio.gather(*(fleet[i % 3].admit(keys[i % len(keys)]) for i in order))
        chosen = [keys[i % len(keys)] for i in order]
        by_key = Counter(k.id for k, r in zip(chosen, results, strict=True) if isinstance(r, Ticket))
        by_project = Counter[int]()
        for key_id, count in by_key.items():
            by_project[keys[key_id - 1].project_id] += count
        assert sum(by_key.values()) <= 50
        assert all(by_key[k] <= 3 for k in range(1, 4))
        assert all(by_project[p] <= 5 + p for p in range(1, projects + 1))
        for limit in limits:
            assert await _granted(fleet[0].pool, str(limit.scope), "requests") <= (limit.rpm or 0)
        # A gateway may have held what another's requests needed, but only until it gave it back:
        # one request at a time, after every gateway's renewals, takes the org to exactly its limit.
        admitted = sum(by_key.values())
        refused_in_a_row = 0
        for i in range(200):
            for gateway in fleet:
                await gateway.give_back()
            if isinstance(await fleet[i % 3].admit(keys[3 + i % (len(keys) - 3)]), Ticket):
                admitted += 1
                refused_in_a_row = 0
            else:
                refused_in_a_row += 1
                if refused_in_a_row == 12:
                    break
        assert admitted == 50


class TestThroughTheGateways:
    async def test_200_chat_requests_split_over_two_gateways_at_rpm_60_get_60_answers_and_140_refusals(
        self, store: Store, postgres_url: str
    ) -> None:
        """The admission stage of two whole gateway apps, a sim engine behind both, over loopback HTTP."""
        plaintext, _ = await create_key(store, "shared")
        await tenancy.set_quota(store, "project:default", rpm=60)
        cfg = ServerConfig(models=[ModelConfig(name=MODEL)])
        sim = TestServer(make_sim_app(MODEL), host="127.0.0.1", port=0)
        await sim.start_server()
        async with contextlib.AsyncExitStack() as stack:
            stack.push_async_callback(sim.close)
            clients: list[TestClient[web.Request, web.Application]] = []
            for _ in range(2):
                shared = await stack.enter_async_context(open_postgres(postgres_url))
                pool = shared.pool
                keys, recorder = KeyCache(), UsageRecorder()
                await keys.refresh(store)
                quotas = Quotas(recorder, allowance=Allowance(pool))
                await quotas.refresh(store)
                catalog = Catalog(cfg)
                replicas = FakeReplicas(endpoints={MODEL: [f"http://127.0.0.1:{sim.port}"]})
                admission = Admission(cfg, catalog, quotas, recorder)
                app = make_gateway_app(cfg, catalog, replicas, keys, admission)
                server = TestServer(app, host="127.0.0.1", port=0)
                clients.append(await stack.enter_async_context(TestClient(server)))

            async def chat(client: TestClient[web.Request, web.Application]) -> int:
                body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
                headers = {"Authorization": f"Bearer {plaintext}"}
                async with client.post("/v1/chat/completions", json=body, headers=headers) as reply:
                    await reply.read()
                    return reply.status

            statuses = Counter(await asyncio.gather(*(chat(clients[i % 2]) for i in range(200))))
        assert statuses == {200: 60, 429: 140}
