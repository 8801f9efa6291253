"""Limits and budgets in memory: admission checks and reserves every scope of a key's chain at once.

A key's chain is the key, its project, the project's team and the team's
org. Admission runs without an await from the first check to the last
reservation, so on the one event loop no other request can slip in between:
200 concurrent requests on a key with rpm=60 admit exactly 60.

Rate limits count a sliding 60-second window per scope: every admitted
request stays in the window for 60 s with the tokens it reserved (its prompt
estimate and max_tokens), settled to what the engine reported once it ends.
Budgets count money per period (day, week, month in UTC, or total): what the
store's usage says was spent, plus what was settled since, plus what requests
in flight have reserved.

With several gateways on one PostgreSQL, each also holds a lease of every
limited scope's allowance (gateway/allowance.py) and admits only within it:
admit() raises Short when a lease has too little, and admit_leased() claims
more and tries again, refusing only once nothing is left that no other
gateway holds.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, date, datetime, timedelta

import attrs

from llmgw.config import PriceConfig
from llmgw.gateway.allowance import Allowance, Lease, StoreUnreachable
from llmgw.gateway.errors import ApiError
from llmgw.gateway.journal import Entry
from llmgw.gateway.usage import UsageRecorder
from llmgw.store.db import Store
from llmgw.store.keys import KeyRecord
from llmgw.store.prices import list_prices
from llmgw.store.quotas import Budget, Limits, Period, list_budgets, list_limits
from llmgw.store.scopes import Chain, Hierarchy, Scope, list_deleted_projects, load_hierarchy
from llmgw.store.usage import cost_by_day

WINDOW_S = 60.0


class _Reservation:
    """One admitted request, in the window of every limited scope of its chain."""

    __slots__ = ("t", "tokens")

    def __init__(self, t: float, tokens: int) -> None:
        self.t = t
        self.tokens = tokens


class _Window:
    """The requests of the last 60 s of one scope, and the tokens they hold."""

    __slots__ = ("events", "requests", "rpm_lease", "tokens", "tpm_lease")

    def __init__(self) -> None:
        self.events: deque[_Reservation] = deque()
        self.requests = 0
        self.tokens = 0
        # With PostgreSQL: what this gateway holds of the scope's requests and tokens.
        self.rpm_lease: Lease | None = None
        self.tpm_lease: Lease | None = None

    def prune(self, now: float) -> None:
        events = self.events
        edge = now - WINDOW_S
        while events and events[0].t <= edge:
            gone = events.popleft()
            self.requests -= 1
            self.tokens -= gone.tokens

    def requests_free_in(self, rpm: int, now: float) -> float:
        """Seconds until the window holds fewer than rpm requests."""
        if rpm <= 0 or self.requests < rpm:
            return WINDOW_S if rpm <= 0 else 0.0
        return self.events[self.requests - rpm].t + WINDOW_S - now

    def tokens_free_in(self, tpm: int, tokens: int, now: float) -> float:
        """Seconds until `tokens` more fit under tpm, or the window is empty."""
        held = self.tokens
        if tpm <= 0:
            return WINDOW_S
        if tokens > tpm:
            return math.inf
        if held + tokens <= tpm:
            return 0.0
        for event in self.events:
            held -= event.tokens
            if held <= 0 or held + tokens <= tpm:
                return event.t + WINDOW_S - now
        return WINDOW_S


@attrs.define
class _BudgetState:
    """A budget and what counts against it; kept across refreshes, since tickets point at it."""

    amount: float
    period: Period
    starts: str = ""  # ISO date the current period starts on
    ends_at: float = 0.0  # wall-clock second the next one starts at
    spent: float = 0.0
    reserved: float = 0.0
    # With PostgreSQL: what this gateway settled this period, and its lease of the period's budget.
    mine: float = 0.0
    lease: Lease | None = None

    def roll(self, now: float) -> None:
        if now >= self.ends_at:
            self.begin(*_period(self.period, now))
            self.spent = 0.0

    def begin(self, starts: str, ends_at: float) -> None:
        if starts != self.starts:
            # A new period: a new lease, and nothing of this gateway's spent in it yet.
            self.mine = 0.0
            self.lease = None
        self.starts, self.ends_at = starts, ends_at


def _period(period: Period, now: float) -> tuple[str, float]:
    today = datetime.fromtimestamp(now, UTC).date()
    if period == "total":
        return date.min.isoformat(), math.inf
    if period == "day":
        start, end = today, today + timedelta(days=1)
    elif period == "week":
        start = today - timedelta(days=today.weekday())
        end = start + timedelta(days=7)
    else:
        start = today.replace(day=1)
        end = (start + timedelta(days=32)).replace(day=1)
    return start.isoformat(), datetime.combine(end, datetime.min.time(), UTC).timestamp()


@attrs.define
class Ticket:
    """What one admitted request reserved, to be settled when it ends."""

    reservation: _Reservation
    windows: list[_Window]
    budgets: list[_BudgetState]
    cost: float
    settled: bool = False


@attrs.frozen
class Shortfall:
    """A lease with too little for one request: what it needs more, and what to say if nobody has it."""

    lease: Lease
    need: float
    scope: Scope
    what: str  # "requests", "tokens" or "budget"


class Short(Exception):
    """This gateway's leases hold too little to admit the request; claim more, then admit again."""

    def __init__(self, shortfalls: list[Shortfall]) -> None:
        super().__init__("leases too short")
        self.shortfalls = shortfalls


def _over(window: _Window, tpm: int, tokens: int) -> bool:
    """Whether tokens more would pass tpm: a tpm of 0 refuses everything."""
    return window.tokens + tokens > tpm


def _first_free(lease: Lease, window: _Window | None) -> tuple[int, float]:
    """When a unit of the lease's scope may first be had here: whole seconds (at least 1), and exact.

    The first of this gateway's own requests to leave the window frees a unit of its lease; another
    gateway's unit comes back at its renewal after its own first request leaves (the store says when,
    at the claim that found nothing left). Before the earlier of the two no claim finds anything: the
    renewal interval it once said instead was a retry sure to be refused.
    """
    now = time.monotonic()
    waits: list[float] = []
    if window is not None and window.events:
        waits.append(window.events[0].t + WINDOW_S - now)
    if lease.others_free_at is not None:
        waits.append(lease.others_free_at - now)
    # Neither: nobody holds a unit, so the next claim finds one.
    wait = max(min(waits), 0.0) if waits else 0.0
    return max(math.ceil(wait), 1), wait


def _seconds(value: float) -> str:
    return f"{max(value, 0.0):.3f}".rstrip("0").rstrip(".") + "s"


class Quotas:
    """Every scope's limits and budgets, their windows and spending; loaded from the store, refreshed."""

    def __init__(
        self,
        recorder: UsageRecorder,
        *,
        default_rpm: int = 0,
        default_tpm: int = 0,
        allowance: Allowance | None = None,
    ) -> None:
        self._recorder = recorder
        # None: one gateway (SQLite), whose windows alone decide.
        self._allowance = allowance
        # 0 in server.yaml means unlimited; None here, like a scope without a limit.
        self._default = (default_rpm or None, default_tpm or None)
        self._hierarchy = Hierarchy({}, {}, {})
        self._limits: dict[Scope, tuple[int | None, int | None]] = {}
        self._budgets: dict[Scope, _BudgetState] = {}
        self._windows: dict[Scope, _Window] = {}
        self._chains: dict[int, tuple[Scope, ...]] = {}
        # Deleted projects' chains as they were (deleted_projects, migration 12): what they sent in the
        # minute before a restart still fills their team's and organisation's windows after it.
        self._deleted: dict[int, tuple[Scope, ...]] = {}
        # Prices set with `llmgw prices set`, by model; reloaded with the limits, so they bind as fast.
        self._prices: Mapping[str, PriceConfig] = {}
        self.prices_generation = 0

    @property
    def hierarchy(self) -> Hierarchy:
        return self._hierarchy

    @property
    def prices(self) -> Mapping[str, PriceConfig]:
        """The prices the store holds, which come before server.yaml's; prices_generation counts changes."""
        return self._prices

    @property
    def budgets(self) -> list[Budget]:
        return [Budget(scope, state.amount, state.period) for scope, state in self._budgets.items()]

    def spent(self, scope: Scope) -> float | None:
        """What counts as spent in the current period of the scope's budget; None without a budget."""
        state = self._budgets.get(scope)
        if state is None:
            return None
        state.roll(time.time())
        return state.spent

    def replace(
        self,
        hierarchy: Hierarchy,
        limits: Sequence[Limits],
        budgets: Sequence[Budget],
        prices: Mapping[str, PriceConfig] | None = None,
    ) -> None:
        """Swap in what the store holds; windows, spending and reservations carry over.

        prices None: the prices stay as they were.
        """
        if prices is not None and prices != self._prices:
            self._prices = dict(prices)
            self.prices_generation += 1
        self._hierarchy = hierarchy
        self._chains = {pid: hierarchy.chain(pid).scopes for pid in hierarchy.projects}
        self._limits = {lim.scope: (lim.rpm, lim.tpm) for lim in limits}
        kept: dict[Scope, _BudgetState] = {}
        for budget in budgets:
            state = self._budgets.get(budget.scope)
            if state is None or state.period != budget.period:
                state = _BudgetState(budget.amount, budget.period)
            state.amount = budget.amount
            kept[budget.scope] = state
        self._budgets = kept

    async def refresh(self, store: Store) -> None:
        """Reload the hierarchy, limits and budgets, and count each budget's spending again."""
        hierarchy = await load_hierarchy(store)
        # Deleting a project that spent must not hand its team and org the money back: its usage stays
        # under its id, counted toward the team and org it was in.
        deleted = {gone.id: gone.scopes for gone in await list_deleted_projects(store)}
        limits = await list_limits(store)
        budgets = await list_budgets(store)
        prices = {p.model: p.price for p in await list_prices(store)}
        now = time.time()
        starts = {b.scope: _period(b.period, now)[0] for b in budgets}
        spent = dict.fromkeys(starts, 0.0)
        if starts:
            # Under the writer's lock, so a batch is in the store or pending, never both.
            async with self._recorder.lock:
                rows = await cost_by_day(store, min(starts.values()))
                rows += [(k.day, k.key_id, k.project_id, t.cost) for k, t in self._recorder.pending()]
        else:
            rows = []
        for day, key_id, project_id, cost in rows:
            chain: tuple[Scope, ...] = (Scope("key", key_id),)
            if project_id in hierarchy.projects:
                chain += hierarchy.chain(project_id).scopes
            else:
                chain += deleted.get(project_id, ())
            for scope in chain:
                if scope in starts and day >= starts[scope]:
                    spent[scope] += cost
        self.replace(hierarchy, limits, budgets, prices)
        self._deleted = dict(deleted)
        # Nothing awaited since the rows were read: every settlement since is in them.
        for scope, state in self._budgets.items():
            state.begin(*_period(state.period, now))
            state.spent = spent[scope]

    def restore(self, entries: Iterable[Entry]) -> None:
        """Put the requests of the last minute back in their scopes' windows, after a restart.

        From the usage journal: with what they used, on every scope of their chain, as admit() and
        settle() left them; refresh() first, for the chains. A project deleted since keeps its
        chain: deleting it must not free its team's and organisation's minute.
        """
        now, wall = time.monotonic(), time.time()
        for entry in sorted(entries, key=lambda e: e.t):
            if not entry.admitted or entry.t <= wall - WINDOW_S:
                continue
            reservation = _Reservation(now - (wall - entry.t), entry.prompt_tokens + entry.completion_tokens)
            chain = self._chains.get(entry.project_id) or self._deleted.get(entry.project_id, ())
            for scope in (Scope("key", entry.key_id), *chain):
                window = self._windows.get(scope)
                if window is None:
                    window = self._windows[scope] = _Window()
                window.events.append(reservation)
                window.requests += 1
                window.tokens += reservation.tokens

    def chain(self, key: KeyRecord) -> Chain | None:
        if key.project_id in self._hierarchy.projects:
            return self._hierarchy.chain(key.project_id)
        return None

    def _name(self, scope: Scope, key: KeyRecord) -> str:
        if scope.kind == "key":
            return f"key '{key.name}' ({key.prefix}…)"
        return self._hierarchy.name(scope)

    def admit(self, key: KeyRecord, tokens: int, cost: float) -> Ticket:
        """Check every scope of key's chain and reserve on all of them, or raise a 429 naming the scope."""
        scopes = (Scope("key", key.id), *self._chains.get(key.project_id, ()))
        limited: list[tuple[Scope, int | None, int | None]] = []
        any_rpm = any_tpm = False
        for scope in scopes:
            found = self._limits.get(scope)
            if found is not None:
                rpm, tpm = found
                any_rpm = any_rpm or rpm is not None
                any_tpm = any_tpm or tpm is not None
                limited.append((scope, rpm, tpm))
        # auth.default_rpm/default_tpm: for a key that no scope of its chain limits.
        default_rpm = None if any_rpm else self._default[0]
        default_tpm = None if any_tpm else self._default[1]
        if default_rpm is not None or default_tpm is not None:
            if limited and limited[0][0] == scopes[0]:
                # The key limits one kind itself: one window, both limits.
                _, rpm, tpm = limited[0]
                limited[0] = (
                    scopes[0],
                    rpm if rpm is not None else default_rpm,
                    tpm if tpm is not None else default_tpm,
                )
            else:
                limited.insert(0, (scopes[0], default_rpm, default_tpm))
        now = time.monotonic()
        allowance = self._allowance
        if allowance is not None and allowance.unreachable:
            # PostgreSQL is away: counted alone, as one gateway counts, rather than refuse everything.
            allowance = None
        # With PostgreSQL: each lease this request spends, and what it needs of it; those too short.
        # None until needed: the one-gateway path allocates nothing more than it did.
        leased: list[tuple[Lease, float]] | None = None
        short: list[Shortfall] | None = None
        windows: list[_Window] = []
        for scope, rpm, tpm in limited:
            window = self._windows.get(scope)
            if window is None:
                window = self._windows[scope] = _Window()
            window.prune(now)
            # A request that may use more than the whole minute's allowance is refused even on an
            # empty window: admitted, it could take the window past its limit.
            if (rpm is not None and window.requests >= rpm) or (
                tpm is not None and _over(window, tpm, tokens)
            ):
                raise self._rate_limited(scope, key, window, rpm, tpm, tokens, now)
            if allowance is not None:
                if leased is None:
                    leased = []
                if rpm is not None:
                    lease = window.rpm_lease or self._rate_lease(allowance, scope, window, "requests")
                    lease.limit = rpm
                    leased.append((lease, 1))
                    if not lease.fits(window.requests, 1, now):
                        short = short or []
                        short.append(Shortfall(lease, 1, scope, "requests"))
                if tpm is not None:
                    lease = window.tpm_lease or self._rate_lease(allowance, scope, window, "tokens")
                    lease.limit = tpm
                    leased.append((lease, tokens))
                    if not lease.fits(window.tokens, tokens, now):
                        short = short or []
                        short.append(Shortfall(lease, tokens, scope, "tokens"))
            windows.append(window)
        budgets: list[_BudgetState] = []
        for scope in scopes:
            state = self._budgets.get(scope)
            if state is not None:
                state.roll(time.time())
                if state.spent + state.reserved + cost > state.amount:
                    raise self._budget_spent(scope, key, state, cost)
                if allowance is not None and cost > 0:
                    lease = state.lease or self._budget_lease(allowance, scope, state)
                    lease.limit = state.amount
                    if leased is None:
                        leased = []
                    leased.append((lease, cost))
                    if not lease.fits(state.mine + state.reserved, cost, now):
                        short = short or []
                        short.append(Shortfall(lease, cost, scope, "budget"))
                budgets.append(state)
        if short:
            raise Short(short)
        if leased:
            assert allowance is not None
            for lease, need in leased:
                lease.spent += need
                if lease.told_spare and lease.busy() + need >= lease.units:
                    allowance.filled(lease)
        reservation = _Reservation(now, tokens)
        for window in windows:
            window.events.append(reservation)
            window.requests += 1
            window.tokens += tokens
        for state in budgets:
            state.reserved += cost
        return Ticket(reservation, windows, budgets, cost)

    def settle(self, ticket: Ticket, tokens: int, cost: float) -> None:
        """Replace what the request reserved by what it used."""
        if ticket.settled:
            return
        ticket.settled = True
        reservation = ticket.reservation
        delta = tokens - reservation.tokens
        now = time.monotonic()
        for window in ticket.windows:
            window.prune(now)
            # Once out of the window its reservation has already been taken off.
            if reservation.t > now - WINDOW_S:
                window.tokens += delta
        reservation.tokens = tokens
        for state in ticket.budgets:
            state.reserved -= ticket.cost
            state.spent += cost
            state.mine += cost

    def _rate_lease(self, allowance: Allowance, scope: Scope, window: _Window, kind: str) -> Lease:
        def busy() -> float:
            window.prune(time.monotonic())
            return window.requests if kind == "requests" else window.tokens

        def frees() -> float | None:
            # The store tells the other gateways when this one's first unit comes back.
            return window.events[0].t + WINDOW_S - time.monotonic() if window.events else None

        lease = allowance.lease(str(scope), kind, busy, frees=frees)
        if kind == "requests":
            window.rpm_lease = lease
        else:
            window.tpm_lease = lease
        return lease

    def _budget_lease(self, allowance: Allowance, scope: Scope, state: _BudgetState) -> Lease:
        # One lease per period: its rows are the period's, and a new period starts from none.
        lease = allowance.lease(
            str(scope),
            f"budget {state.period} {state.starts}",
            lambda: state.mine + state.reserved,
            ends=state.ends_at,
            before=lambda: max(state.spent - state.mine, 0.0),
        )
        state.lease = lease
        return lease

    async def admit_leased(self, key: KeyRecord, tokens: int, cost: float, short: Short) -> Ticket:
        """admit() once the leases it found short have claimed more; refused once nobody holds any more.

        A request waits for the claim rather than being refused while allowance is left that no
        gateway holds.
        """
        allowance = self._allowance
        assert allowance is not None
        # Each round either admits, or claims allowance another request here took first; a bound
        # all the same, should the claims keep coming back with too little.
        for _ in range(32):
            for shortfall in short.shortfalls:
                try:
                    await allowance.claim(shortfall.lease, shortfall.need)
                except StoreUnreachable:
                    # Marked unreachable (and said once): admitted by this gateway's count alone.
                    return self.admit(key, tokens, cost)
            try:
                return self.admit(key, tokens, cost)
            except Short as again:
                for shortfall in again.shortfalls:
                    if shortfall.lease.dry and not shortfall.lease.lock.locked():
                        raise self._refused_everywhere(shortfall, key, tokens, cost) from None
                short = again
        raise self._refused_everywhere(short.shortfalls[0], key, tokens, cost)

    def _refused_everywhere(self, shortfall: Shortfall, key: KeyRecord, tokens: int, cost: float) -> ApiError:
        """The 429 for a request no gateway has allowance left for: the others hold the rest."""
        name = self._name(shortfall.scope, key)
        limit = shortfall.lease.limit
        if shortfall.what == "budget":
            state = self._budgets.get(shortfall.scope)
            period = "in total" if state is None or state.period == "total" else f"this {state.period}"
            return ApiError(
                429,
                f"the budget of {name} has too little left for this request: what every gateway together "
                f"has spent {period} and holds for requests in flight leaves less of its {limit:g} than "
                f"the {cost:.4g} this request may cost (its prompt and max_tokens); try again when "
                "requests in flight have finished",
                type="insufficient_quota",
                code="insufficient_quota",
                headers={"Retry-After": "1"},
                refusal=(shortfall.scope.kind, "budget"),
            )
        seconds, wait = _first_free(shortfall.lease, self._windows.get(shortfall.scope))
        if shortfall.what == "requests":
            said = f"{limit:.0f} requests per minute"
        else:
            said = (
                f"{limit:.0f} tokens per minute (this request reserves {tokens}: its prompt and max_tokens)"
            )
        return ApiError(
            429,
            f"rate limit reached for {name}: {said}, counted across every gateway; try again in {seconds} s",
            type=shortfall.what,
            code="rate_limit_exceeded",
            headers={
                f"x-ratelimit-limit-{shortfall.what}": f"{limit:.0f}",
                f"x-ratelimit-remaining-{shortfall.what}": "0",
                "Retry-After": str(seconds),
                "retry-after-ms": str(max(math.ceil(wait * 1000), 1)),
            },
            refusal=(shortfall.scope.kind, shortfall.what),
        )

    def _rate_limited(
        self,
        scope: Scope,
        key: KeyRecord,
        window: _Window,
        rpm: int | None,
        tpm: int | None,
        tokens: int,
        now: float,
    ) -> ApiError:
        headers: dict[str, str] = {}
        waits: list[float] = []
        said: list[str] = []
        if rpm is not None:
            wait = window.requests_free_in(rpm, now)
            headers["x-ratelimit-limit-requests"] = str(rpm)
            headers["x-ratelimit-remaining-requests"] = str(max(rpm - window.requests, 0))
            headers["x-ratelimit-reset-requests"] = _seconds(wait)
            if window.requests >= rpm:
                waits.append(wait)
                said.append(f"{rpm} requests per minute")
        if tpm is not None:
            wait = window.tokens_free_in(tpm, tokens, now)
            headers["x-ratelimit-limit-tokens"] = str(tpm)
            headers["x-ratelimit-remaining-tokens"] = str(max(tpm - window.tokens, 0))
            headers["x-ratelimit-reset-tokens"] = _seconds(wait)
            if _over(window, tpm, tokens):
                waits.append(wait)
                said.append(
                    f"{tpm} tokens per minute (this request reserves {tokens}: its prompt and max_tokens)"
                )
        kind = "requests" if rpm is not None and window.requests >= rpm else "tokens"
        wait = max(waits)
        if math.isinf(wait):
            # More than the whole minute's allowance: no wait helps.
            del headers["x-ratelimit-reset-tokens"]
            advice = "no retry will help: ask for fewer max_tokens or send a shorter prompt"
        else:
            headers["Retry-After"] = str(max(math.ceil(wait), 1))
            headers["retry-after-ms"] = str(max(math.ceil(wait * 1000), 1))
            advice = f"try again in {max(math.ceil(wait), 1)} s"
        return ApiError(
            429,
            f"rate limit reached for {self._name(scope, key)}: {' and '.join(said)}; {advice}",
            type=kind,
            code="rate_limit_exceeded",
            headers=headers,
            refusal=(scope.kind, kind),
        )

    def _budget_spent(self, scope: Scope, key: KeyRecord, state: _BudgetState, cost: float) -> ApiError:
        period = "in total" if state.period == "total" else f"this {state.period} (since {state.starts})"
        name = self._name(scope, key)
        if state.spent >= state.amount:
            said = f"the budget of {name} is spent: {state.spent:.4g} of {state.amount:g} {period}"
        else:
            held = f", {state.reserved:.4g} held by requests in flight" if state.reserved else ""
            said = (
                f"the budget of {name} has too little left for this request: {state.spent:.4g} of "
                f"{state.amount:g} spent {period}{held}, and this request may cost up to {cost:.4g} "
                "(its prompt and max_tokens)"
            )
        headers: dict[str, str] | None = None
        if math.isfinite(state.ends_at):
            wait = max(math.ceil(state.ends_at - time.time()), 1)
            headers = {"Retry-After": str(wait)}
            until = f"; it renews on {datetime.fromtimestamp(state.ends_at, UTC):%Y-%m-%d} (UTC)"
        elif state.spent + cost > state.amount:
            # A total budget never renews: only an administrator raising it helps.
            until = "; a total budget does not renew, so no retry will help until it is raised"
        else:
            # Only what requests in flight hold stands in the way; they settle to what they use.
            headers = {"Retry-After": "1"}
            until = "; try again when requests in flight have finished"
        return ApiError(
            429,
            said + until,
            type="insufficient_quota",
            code="insufficient_quota",
            headers=headers,
            refusal=(scope.kind, "budget"),
        )
