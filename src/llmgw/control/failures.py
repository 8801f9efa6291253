"""The last failures of replicas, per model and node, kept so their cause can be shown later.

A failed replica is stopped and forgotten by the next reconcile pass, and its
node then only reads "is backing off after 2 failures": the one thing an
operator needs, the engine's own last words, was gone with it. Here each
failure outlives its replica, bounded so a model failing for days holds a few
kilobytes, not its whole history.

A profile that fails on a node the same way GIVE_UP_AFTER times in a row is
given up there: vLLM that answers /health, then dies at its first request
(a head size its CPU kernels lack), was started again forever, a full start
of minutes each time, while `ctl explain` called the node a candidate. It is
tried there again once the model's definition changes or the node's agent
registers again: either may be the fix.
"""

from __future__ import annotations

import re
import time
from collections import deque
from collections.abc import Callable

import attrs
import structlog

log = structlog.get_logger(__name__)

# Per model and node: enough to see whether it fails the same way every time.
PER_MODEL_AND_NODE = 5
# In all: a fleet of broken nodes must not grow the control plane's memory without end.
MAX_KEPT = 500
# Identical failures in a row after which a profile is no longer placed on a node.
GIVE_UP_AFTER = 3
# Numbers, which two failures of one cause may differ in: "stopped answering /health 2 s ago",
# then "3 s ago"; "killed by SIGKILL" is the same failure on port 20013 as on 20014.
_NUMBER = re.compile(r"\d+(?:\.\d+)?")
# A replica that served this long before failing proved the profile runs on its node: its failure
# (a card lost after a day's work) starts no count towards giving up.
PROVEN_S = 600.0


@attrs.frozen
class Failure:
    """One replica (or one rank of one) that failed, as its node reported it."""

    shard_id: str
    model: str
    node_id: str
    engine: str
    profile: str
    # In words: "llamacpp exited with code 1: error: failed to load model".
    reason: str
    last_output: tuple[str, ...]
    # The inventory's clock (time.monotonic) when the failure was reported.
    at: float


@attrs.frozen
class GivenUp:
    """A profile of a model no longer placed on a node: it failed there the same way, again and again."""

    failures: int
    # The reason each of them gave, in the node's words.
    reason: str

    def words(self) -> str:
        """What follows the node's name in `ctl explain`: "is given up for this profile: ..."."""
        return (
            f"is given up for this profile: its replica failed there the same way {self.failures} times "
            f"in a row ({self.reason}); it is tried there again once the model's definition changes "
            "or the node's agent registers again"
        )


class Failures:
    """The most recent failures, newest last; what backoff, explain, the 503 and the pages read."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._kept: deque[Failure] = deque(maxlen=MAX_KEPT)
        # (model, node) -> failures there since the model last served there. Not the kept ones
        # counted: those stop at PER_MODEL_AND_NODE, and outlive a replica that served since.
        self._streaks: dict[tuple[str, str], int] = {}
        # (model, profile, node) -> the last failure's reason there, numbers masked, how many in a row
        # gave it, and the last one's words. Not reset by a replica becoming ready: the engine that
        # dies at its first request does become ready.
        self._same: dict[tuple[str, str, str], tuple[str, int, str]] = {}
        # shard -> the clock when it became ready, for how long it served before it failed.
        self._ready_since: dict[str, float] = {}

    def add(self, failure: Failure) -> None:
        # An agent repeats a failed shard's status when it reconnects: once is enough. A shard
        # restarted on its node that fails again is a new failure, with new output.
        newest = next((f for f in reversed(self._kept) if f.shard_id == failure.shard_id), None)
        if newest is not None and (newest.reason, newest.last_output) == (
            failure.reason,
            failure.last_output,
        ):
            return
        self._kept.append(failure)
        key = (failure.model, failure.node_id)
        self._streaks[key] = self._streaks.pop(key, 0) + 1
        if len(self._streaks) > MAX_KEPT:
            del self._streaks[next(iter(self._streaks))]
        self._count_same(failure)
        same = [f for f in self._kept if (f.model, f.node_id) == (failure.model, failure.node_id)]
        for old in same[:-PER_MODEL_AND_NODE]:
            self._kept.remove(old)

    def _count_same(self, failure: Failure) -> None:
        key = (failure.model, failure.profile, failure.node_id)
        ready_at = self._ready_since.pop(failure.shard_id, None)
        # A failure without words (an agent too old to give them) cannot be told identical to another.
        if not failure.reason or (ready_at is not None and failure.at - ready_at >= PROVEN_S):
            self._same.pop(key, None)
            return
        said = _NUMBER.sub("N", failure.reason)
        before, count, _ = self._same.pop(key, ("", 0, ""))
        count = count + 1 if before == said else 1
        self._same[key] = (said, count, failure.reason)
        if count == GIVE_UP_AFTER:
            log.warning(
                "a profile failed the same way on a node again and again: no longer placed there "
                "until the model's definition changes or the node's agent registers again",
                model=failure.model,
                profile=failure.profile,
                node=failure.node_id,
                failures=count,
                reason=failure.reason,
            )
        if len(self._same) > MAX_KEPT:
            del self._same[next(iter(self._same))]

    def served(self, model: str, node_id: str, shard_id: str = "") -> None:
        """A replica of model became ready on node_id: the next failure there is a first again."""
        self._streaks.pop((model, node_id), None)
        if shard_id:
            self._ready_since.setdefault(shard_id, self._clock())
            if len(self._ready_since) > MAX_KEPT:
                del self._ready_since[next(iter(self._ready_since))]

    def given_up(self) -> dict[tuple[str, str], dict[str, GivenUp]]:
        """(model, node) -> the profiles of model no longer placed on node, and why."""
        out: dict[tuple[str, str], dict[str, GivenUp]] = {}
        for (model, profile, node), (_, count, reason) in self._same.items():
            if count >= GIVE_UP_AFTER:
                out.setdefault((model, node), {})[profile] = GivenUp(failures=count, reason=reason)
        return out

    def forget_model(self, model: str) -> None:
        """Model's definition changed: every node is worth a try again."""
        for key in [k for k in self._same if k[0] == model]:
            del self._same[key]

    def forget_node(self, node_id: str) -> None:
        """Node's agent registered again (restarted, upgraded, its engines reinstalled): worth a try again."""
        for key in [k for k in self._same if k[2] == node_id]:
            del self._same[key]

    def retrying(self, model: str, node_id: str) -> str:
        """ "try 2; the last did not answer /health within 30 s" for a replica starting where the
        model failed since it last served; empty where it did not.

        Until backoff starts, a replica starting again after a failure read only "starting on n1
        for 5 s", the same as the first: nothing said it had failed, nor why.
        """
        streak = self._streaks.get((model, node_id), 0)
        last = self.last(model, node_id)
        if not streak or last is None:
            return ""
        return f"try {streak + 1}; the last {last.reason.removeprefix(f'{last.engine} ')}"

    def last(self, model: str, node_id: str) -> Failure | None:
        """The newest failure of model on node_id, if any is kept."""
        for failure in reversed(self._kept):
            if failure.model == model and failure.node_id == node_id:
                return failure
        return None

    def of_shard(self, shard_id: str) -> Failure | None:
        """The newest failure of replica shard_id, if any is kept."""
        return next((f for f in reversed(self._kept) if f.shard_id == shard_id), None)

    def recent(self, model: str | None = None) -> list[Failure]:
        """The kept failures of model (or of all), newest first."""
        return [f for f in reversed(self._kept) if model is None or f.model == model]

    def age(self, failure: Failure) -> float:
        """Seconds since failure was reported."""
        return max(0.0, self._clock() - failure.at)
