"""How many replicas an on-demand model (`scale`) runs now, and why: the leader's scale decisions.

A model with a fixed `replicas: N` always wants N. One with `scale: {min, max, idle_s}` wants:

- at least one as soon as a request is held for it (gateway/coldstart.py), even with `min: 0`;
- one more when the requests in flight per ready replica have stayed above `target_in_flight`
  for `window_s` (up to `max`), one fewer when the others would have stayed below it (down to
  `min`, and never below one while requests come);
- `min` once no request has come for `idle_s`.

Each decision is kept with its inputs and its reason, in words, for `ctl models`, `ctl explain`,
the models page and the metrics; only the leader's reconciler makes them, each pass, and they are
written to the store (store/scale.py) so that a restart or a takeover goes on from them rather than
from nothing. The cold starts it sees through are measured here too (place, weights, engine start),
the last one kept as the model's expected cold start.

Which replica goes when one is removed, and which idle replica of another model makes room for a
model that must start (eviction), are said here; where a replica goes is placement's to say.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable, Mapping, Sequence

import attrs
import cattrs
import structlog
from prometheus_client import CollectorRegistry, Counter, Gauge

from llmgw import strictjson
from llmgw.config import ModelConfig
from llmgw.control.inventory import READY, Inventory, Replica
from llmgw.errors import StoreError
from llmgw.gateway.coldstart import ColdStarts
from llmgw.ondemand import cold_start_bound_s, on_demand, scale_of
from llmgw.store import Store
from llmgw.store import scale as stored

log = structlog.get_logger(__name__)


@attrs.frozen
class ColdStart:
    """One measured cold start: the held request's whole wait and its parts, in seconds."""

    total_s: float
    # From the first held request to the StartShard sent to a node.
    place_s: float
    # From StartShard to the engine's process starting: fetching or checking the weights.
    weights_s: float
    # From the engine's process starting to its first health check passed.
    engine_s: float
    node: str

    def words(self) -> str:
        return (
            f"{self.total_s:.1f} s on {self.node} (place {self.place_s:.1f} s, "
            f"weights {self.weights_s:.1f} s, engine start {self.engine_s:.1f} s)"
        )


@attrs.define
class ScaleState:
    """What the leader decided for one on-demand model, and what it decided it from."""

    model: str
    replicas: int
    reason: str = ""
    # Wall clock of the decision, and of the model's last request any gateway reported.
    decided_at: float = 0.0
    last_request: float = 0.0
    # The inputs of the last pass: ready replicas, requests in flight on them.
    ready: int = 0
    in_flight: int = 0
    # The wall clock when a pass last saw a ready replica of it.
    ready_seen: float = 0.0
    # Since when the load has stayed above the target (or low enough to remove one); None: it has not.
    above_since: float | None = None
    below_since: float | None = None
    cold_start: ColdStart | None = None
    # The last replica stopped to make room for another model, or stopped for this one, in words.
    eviction: str = ""

    def per_replica(self) -> float:
        return self.in_flight / self.ready if self.ready else 0.0


class ScaleMetrics:
    """The scale decisions as series: what each on-demand model runs, the load it decided from, why."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.replicas = Gauge(
            "llmgw_scale_replicas",
            "The replicas the leader decided each on-demand model runs.",
            ["model"],
            registry=registry,
        )
        self.per_replica = Gauge(
            "llmgw_scale_in_flight_per_replica",
            "Requests in flight per ready replica of each on-demand model, at the last reconcile pass.",
            ["model"],
            registry=registry,
        )
        self.target = Gauge(
            "llmgw_scale_target_in_flight",
            "Each on-demand model's scale.target_in_flight.",
            ["model"],
            registry=registry,
        )
        self.held = Gauge(
            "llmgw_scale_held_requests",
            "Requests this server's gateway holds while a replica of the model starts.",
            ["model"],
            registry=registry,
        )
        self.decisions = Counter(
            "llmgw_scale_decisions",
            "Scale decisions that changed a model's replica count, by direction (up, down).",
            ["model", "direction"],
            registry=registry,
        )
        self.evictions = Counter(
            "llmgw_scale_evictions",
            "Idle replicas of the model stopped to make room for another model.",
            ["model"],
            registry=registry,
        )
        self.cold_start = Gauge(
            "llmgw_cold_start_seconds",
            "The last measured cold start of each on-demand model: from its first held request to ready.",
            ["model"],
            registry=registry,
        )


@attrs.define
class _Measuring:
    """A cold start under way: what has been seen of it so far (wall clock)."""

    asked: float
    placed: float | None = None
    node: str = ""
    shard: str = ""
    engine_started: float | None = None


class Scaler:
    """The leader's scale decisions for every on-demand model, made by the reconciler each pass."""

    def __init__(
        self,
        in_flight: Mapping[str, int],
        cold_starts: ColdStarts | None = None,
        clock: Callable[[], float] = time.time,
        store: Store | None = None,
        registry: CollectorRegistry | None = None,
    ) -> None:
        """in_flight: the gateway's requests in flight by endpoint; cold_starts: its held requests and
        last request per model (None: no gateway here); store: where the decisions are kept, and
        where the other gateways' requests are read from (None: kept in memory only)."""
        self._in_flight = in_flight
        self._cold_starts = cold_starts
        self._clock = clock
        self._store = store
        self._metrics = ScaleMetrics(registry if registry is not None else CollectorRegistry())
        self._states: dict[str, ScaleState] = {}
        self._measuring: dict[str, _Measuring] = {}
        # Model -> when a gateway (another server's, read from the store) last held a request for it.
        self._wanted: dict[str, float] = {}
        # Models whose state changed since the last save.
        self.dirty: set[str] = set()
        # Whether this server decides (leads); a standby's scaler only shows.
        self.deciding = False
        # Models whose state was dropped since the last save: their rows go too.
        self._forgotten: set[str] = set()
        # The wall clock of the last read of the store: at most one a second.
        self._read_at = 0.0

    def now(self) -> float:
        return self._clock()

    def held(self, model: str) -> int:
        """Requests this server's gateway holds for model now."""
        return self._cold_starts.held(model) if self._cold_starts is not None else 0

    def state(self, model: str) -> ScaleState | None:
        return self._states.get(model)

    def heard(self, model: str, last_request: float) -> None:
        """A request for model at last_request (wall clock), as a gateway reported it."""
        state = self._states.get(model)
        if state is not None and last_request > state.last_request:
            state.last_request = last_request

    def forget_others(self, models: Sequence[ModelConfig]) -> list[str]:
        """Drop the state of models no longer on demand; their names."""
        keep = {m.name for m in models if on_demand(m)}
        gone = [name for name in self._states if name not in keep]
        for name in gone:
            del self._states[name]
            for gauge in (self._metrics.replicas, self._metrics.per_replica, self._metrics.target):
                with contextlib.suppress(KeyError):
                    gauge.remove(name)
            self._measuring.pop(name, None)
        self._forgotten |= set(gone)
        return gone

    def wanted(self, model: ModelConfig, groups: Mapping[str, list[Replica]]) -> int:
        """How many replicas model should run now; groups: its live replicas (ranks by replica)."""
        if not on_demand(model):
            return model.replicas
        now = self._clock()
        scale = scale_of(model)
        state = self._state_of(model, now)
        ready = [g for g in groups.values() if all(r.state == READY for r in g)]
        state.ready = len(ready)
        state.in_flight = sum(self._in_flight.get(r.endpoint, 0) for g in ready for r in g if r.endpoint)
        if state.ready:
            state.ready_seen = now
        held = self._held(model, now, state)
        if self._cold_starts is not None:
            self.heard(model.name, self._cold_starts.last_request.get(model.name, 0.0))
        before = state.replicas
        wanted = min(max(state.replicas, scale.min), scale.max)
        if wanted != before:
            self._decide(state, wanted, f"{model.name}'s scale is now min {scale.min}, max {scale.max}", now)
        if held and state.replicas == 0:
            self._decide(state, 1, f"a request came for {model.name}, which had no replica running", now)
        elif self._idle(model, state, now, held):
            self._decide(
                state,
                scale.min,
                f"no request for {now - state.last_request:.0f} s (scale.idle_s {scale.idle_s:g})",
                now,
            )
        else:
            self._follow_load(model, state, len(groups), now)
        metrics = self._metrics
        metrics.replicas.labels(model.name).set(state.replicas)
        metrics.per_replica.labels(model.name).set(state.per_replica())
        metrics.target.labels(model.name).set(scale.target_in_flight)
        metrics.held.labels(model.name).set(self.held(model.name))
        return state.replicas

    def _held(self, model: ModelConfig, now: float, state: ScaleState | None) -> bool:
        """Whether a gateway holds a request for model: this server's, or another's within its bound.

        Another server's counts only if it was held since model last had a ready replica: its gateway
        serves it as soon as the published table shows one, and says nothing more. Counted for the
        whole bound, it kept a ready replica from idling, and started it again each time it was stopped.
        """
        if self._cold_starts is not None and model.name in self._cold_starts.waiting():
            return True
        wanted = self._wanted.get(model.name, 0.0)
        served = state.ready_seen if state is not None else 0.0
        return wanted > served and now - wanted < cold_start_bound_s(model)

    def _state_of(self, model: ModelConfig, now: float) -> ScaleState:
        state = self._states.get(model.name)
        if state is None:
            scale = scale_of(model)
            state = ScaleState(model=model.name, replicas=scale.min, decided_at=now)
            state.reason = f"{model.name} starts at its scale.min ({scale.min})"
            self._states[model.name] = state
            self.dirty.add(model.name)
        return state

    def _idle(self, model: ModelConfig, state: ScaleState, now: float, held: bool) -> bool:
        scale = scale_of(model)
        if held or state.in_flight or state.replicas <= scale.min:
            return False
        return now - state.last_request >= scale.idle_s

    def _follow_load(self, model: ModelConfig, state: ScaleState, live: int, now: float) -> None:
        """One more replica when the load has stayed above the target for the window; one fewer when
        the others would have stayed below it."""
        scale = scale_of(model)
        target, window = scale.target_in_flight, scale.window_s
        if not state.ready:
            state.above_since = state.below_since = None
            return
        per = state.per_replica()
        if per > target and state.replicas < scale.max:
            state.below_since = None
            since = state.above_since = state.above_since if state.above_since is not None else now
            # Not while a replica it asked for is still starting: that one is the answer being waited for.
            if now - since >= window and live <= state.replicas and state.ready >= state.replicas:
                self._decide(
                    state,
                    state.replicas + 1,
                    f"{state.replicas + 1} replicas: {per:.1f} in flight per replica "
                    f"for {now - since:.0f} s, target {target:g}",
                    now,
                )
                state.above_since = None
            return
        state.above_since = None
        floor = max(scale.min, 1)
        if state.replicas > floor and state.ready >= 2 and state.in_flight / (state.ready - 1) < target:
            since = state.below_since = state.below_since if state.below_since is not None else now
            if now - since >= window:
                self._decide(
                    state,
                    state.replicas - 1,
                    f"{state.replicas - 1} replicas: {per:.1f} in flight per replica "
                    f"for {now - since:.0f} s, target {target:g}, and one fewer would stay below it",
                    now,
                )
                state.below_since = None
            return
        state.below_since = None

    def _decide(self, state: ScaleState, replicas: int, reason: str, now: float) -> None:
        if state.replicas != replicas:
            direction = "up" if replicas > state.replicas else "down"
            self._metrics.decisions.labels(state.model, direction).inc()
            log.info(
                "scale decision",
                model=state.model,
                replicas=replicas,
                before=state.replicas,
                reason=reason,
                in_flight=state.in_flight,
                ready=state.ready,
            )
        state.replicas, state.reason, state.decided_at = replicas, reason, now
        self.dirty.add(state.model)

    def extras(self, model: ModelConfig, groups: Sequence[list[Replica]], wanted: int) -> list[list[Replica]]:
        """Which of model's live replicas to stop to come down to wanted.

        A fixed model's extras as before (those not ready first). An on-demand model stops only
        replicas with nothing in flight, those not ready first, so that coming down never cuts a
        request short: a busy one is stopped by a later pass, once it is idle.
        """
        by_readiness = sorted(groups, key=lambda g: all(r.state == READY for r in g))
        if not on_demand(model):
            return by_readiness[wanted:]
        surplus = len(groups) - wanted
        if surplus <= 0:
            return []
        idle = [g for g in by_readiness if not self._busy(g)]
        return idle[:surplus]

    def reason(self, model: str) -> str:
        state = self._states.get(model)
        return state.reason if state is not None else ""

    def _busy(self, group: Sequence[Replica]) -> bool:
        return any(self._in_flight.get(r.endpoint, 0) for r in group if r.endpoint)

    def victim(
        self,
        model: ModelConfig,
        catalog: Mapping[str, ModelConfig],
        replicas: Sequence[Replica],
        nodes: set[str],
    ) -> list[Replica] | None:
        """An idle replica of another on-demand model, on one of nodes, whose stopping may make room
        for model: the lowest priority first, then the least recently used; never one serving a
        request, never one its own model needs to stay at its min, never one of a higher priority
        than model's. None when there is none.
        """
        mine = scale_of(model).priority
        groups: dict[str, list[Replica]] = {}
        for r in replicas:
            if r.model != model.name and r.state != "failed":
                groups.setdefault(r.replica_id or r.shard_id, []).append(r)
        live: dict[str, int] = {}
        for g in groups.values():
            live[g[0].model] = live.get(g[0].model, 0) + 1
        best: tuple[int, float, str] | None = None
        chosen: list[Replica] | None = None
        for key, group in groups.items():
            other = catalog.get(group[0].model)
            if other is None or not on_demand(other) or not {r.node_id for r in group} & nodes:
                continue
            scale = scale_of(other)
            held = self._held(other, self._clock(), self._states.get(other.name))
            if self._busy(group) or held or live[other.name] <= scale.min or scale.priority > mine:
                continue
            state = self._states.get(other.name)
            rank = (scale.priority, state.last_request if state is not None else 0.0, key)
            if best is None or rank < best:
                best, chosen = rank, group
        return chosen

    def evicted(self, model: ModelConfig, victim: Sequence[Replica], other: ModelConfig) -> str:
        """Record that victim was stopped to make room for model; the sentence said of it."""
        now = self._clock()
        state = self._states.get(other.name)
        used = (
            f"last used {now - state.last_request:.0f} s ago"
            if state is not None and state.last_request
            else "unused"
        )
        node = victim[0].node_id
        words = f"stopped an idle replica of {other.name} on {node} ({used}) to make room for {model.name}"
        if state is not None:
            self._decide(state, max(state.replicas - 1, scale_of(other).min), words, now)
            state.eviction = words
            self._metrics.evictions.labels(other.name).inc()
        mine = self._states.get(model.name)
        if mine is not None:
            mine.eviction = words
            self.dirty.add(model.name)
        log.info("eviction", model=model.name, evicted=other.name, node=node, reason=words)
        return words

    def placed(self, model: str, node: str, shard: str) -> None:
        """A StartShard was sent for model: the placement part of a cold start under way ends here."""
        asked = self._cold_starts.waiting().get(model) if self._cold_starts is not None else None
        if asked is None:
            return
        measuring = self._measuring.get(model)
        if measuring is None or measuring.asked != asked:
            self._measuring[model] = measuring = _Measuring(asked=asked)
        if measuring.placed is None:
            measuring.placed, measuring.node, measuring.shard = self._clock(), node, shard

    def after_pass(self, inventory: Inventory) -> None:
        """Settle or fail the held requests' starts, and measure the cold starts that finished."""
        if self._cold_starts is None:
            return
        waiting = self._cold_starts.waiting()
        for model, asked in waiting.items():
            measuring = self._measuring.get(model)
            if measuring is None or measuring.asked != asked:
                self._measuring[model] = measuring = _Measuring(asked=asked)
            self._watch(inventory, model, measuring)
        for model in [m for m in self._measuring if m not in waiting]:
            del self._measuring[model]

    def _watch(self, inventory: Inventory, model: str, measuring: _Measuring) -> None:
        assert self._cold_starts is not None
        offset = self._clock() - inventory.now()
        replica = next((r for r in inventory.replicas(model) if r.shard_id == measuring.shard), None)
        if (
            replica is not None
            and replica.state == "starting"
            and not replica.detail.startswith("asked node")
        ):
            measuring.engine_started = measuring.engine_started or replica.since + offset
        ready = inventory.ready_endpoints(model)
        if ready:
            if replica is not None and replica.state == READY and measuring.placed is not None:
                self._measured(model, measuring, replica.since + offset)
            self._cold_starts.settle(model)
            return
        # The replica's failure is recorded by the pass that stops it, before this one looks.
        failure = next((f for f in inventory.failures.recent(model) if f.shard_id == measuring.shard), None)
        if failure is not None:
            self._cold_starts.fail(model, failure.reason or "its engine failed")

    def _measured(self, model: str, measuring: _Measuring, ready_at: float) -> None:
        assert measuring.placed is not None
        engine_started = measuring.engine_started or measuring.placed
        measured = ColdStart(
            total_s=max(0.0, ready_at - measuring.asked),
            place_s=max(0.0, measuring.placed - measuring.asked),
            weights_s=max(0.0, engine_started - measuring.placed),
            engine_s=max(0.0, ready_at - engine_started),
            node=measuring.node,
        )
        state = self._states.get(model)
        if state is not None:
            state.cold_start = measured
            self.dirty.add(model)
        self._metrics.cold_start.labels(model).set(measured.total_s)
        if self._cold_starts is not None:
            self._cold_starts.expected[model] = measured.total_s
        log.info("cold start measured", model=model, took=measured.words())

    # --- the store ------------------------------------------------------------------------------

    async def load(self) -> None:
        """Take up the decisions the store kept: at the start of each term as leader.

        A new leader that knew none decided min again: it stopped the replica a held request had
        just started on the previous one, and every idle timer started over.
        """
        if self._store is None:
            return
        try:
            rows = await stored.read_scales(self._store)
        except StoreError as exc:
            log.warning("could not read the models' scale from the store; deciding anew", error=str(exc))
            return
        for row in rows:
            self._wanted[row.model] = row.wanted_at
            if not row.reason:
                continue
            state = ScaleState(
                model=row.model,
                replicas=row.replicas,
                reason=row.reason,
                decided_at=row.decided_at,
                last_request=row.last_request,
                eviction=row.eviction,
                cold_start=_cold_start(row.cold_start),
                # What a gateway held before the decision was decided on: not held still.
                ready_seen=row.decided_at,
            )
            self._states[row.model] = state
            if state.cold_start is not None and self._cold_starts is not None:
                self._cold_starts.expected[row.model] = state.cold_start.total_s
        self._read_at = self._clock()

    async def save(self) -> None:
        """Write what changed since the last save; read what the other gateways wrote, once a second."""
        if self._store is None:
            return
        changed = [self._states[m] for m in sorted(self.dirty) if m in self._states]
        try:
            await stored.write_decisions(self._store, [_row(s) for s in changed])
            self.dirty.clear()
            if self._forgotten:
                await stored.forget_scales(self._store, list(self._states))
                self._forgotten.clear()
            now = self._clock()
            if now - self._read_at >= 1.0:
                self._read_at = now
                for row in await stored.read_scales(self._store):
                    self._wanted[row.model] = row.wanted_at
                    self.heard(row.model, row.last_request)
        except StoreError as exc:
            # Kept dirty: written by the next pass that reaches the store.
            log.warning("could not write the models' scale to the store", error=str(exc))


_CONVERTER = cattrs.Converter()


def _row(state: ScaleState) -> stored.StoredScale:
    measured = state.cold_start
    return stored.StoredScale(
        model=state.model,
        replicas=state.replicas,
        reason=state.reason,
        decided_at=state.decided_at,
        last_request=state.last_request,
        eviction=state.eviction,
        cold_start=strictjson.dumps(_CONVERTER.unstructure(measured)) if measured is not None else "",
    )


def _cold_start(text: str) -> ColdStart | None:
    if not text:
        return None
    try:
        return _CONVERTER.structure(json.loads(text), ColdStart)
    except (ValueError, cattrs.BaseValidationError):
        # Written by another release in another shape: measured again at the next cold start.
        return None
