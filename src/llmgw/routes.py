"""The inventory's private routing data: what the gateway needs of a ready endpoint beyond its URL.

Each replica's engine admits only callers holding the replica's secret, made
here when the replica is placed, sent in its StartShard and reported back by
the agent with every status (so a control plane that restarted learns it from
the Register of an agent whose engines kept running). The secret lives in this
module's maps and in the EngineRoute handed to the gateway, never on a Replica:
Replica is what the admin API, `ctl` and the pages show.

An endpoint the gateway could not get an answer from leaves the routing table
until its agent reports it ready again (or, on a node whose agent is connected
and says nothing new, until a grace has passed, so a passing fault does not
cost a replica for good). When that happens while its node's agent is
unreachable, the requests in flight there are abandoned with a 502 rather than
left waiting on connections nobody may ever close: each replica has a `lost`
future the proxy listens to. A node going quiet alone abandons nothing: its
engines may well serve on without their agent. An engine its agent reports
stalled is given up the same way, at once: the agent kills it next, and what
it holds would otherwise wait for that and then hear only of a failed connection.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable

import attrs


async def _no_cause(said: str) -> str:
    return ""


@attrs.frozen
class EngineRoute:
    """Where a ready endpoint leads, for the gateway alone: it holds the engine's secret."""

    node_id: str
    shard_id: str
    secret: str = attrs.field(repr=False)
    # Resolves, with a sentence, when the engine fails the gateway while its node's agent is away, or
    # its agent reports it stalled: every request in flight there ends (gateway/proxy.py).
    lost: asyncio.Future[str] = attrs.field(repr=False, eq=False)
    # Tell the inventory the engine did not accept a connection (with the reason).
    refused: Callable[[str], None] = attrs.field(repr=False, eq=False)
    # An endpoint outside the fleet (gateway/endpoints.py): its base URL ("http://10.1.2.3:8000/v1"), which
    # the request's path after /v1 is joined to, and the name it knows the model by. Both empty for a replica.
    url: str = ""
    upstream_model: str = ""
    # The client APIs its engine serves itself (engines/<kind>.py `native_apis`; an endpoint: OpenAI's
    # chat, completions and embeddings); the gateway translates Messages and Responses for one that
    # lacks them. None: not known here, and every API is sent as it came.
    native_apis: frozenset[str] | None = None
    # Given what the engine's 5xx said: the cause the control plane knows, in the node's words, when
    # those are the engine's own words for a dead engine that name none (vLLM's "EngineCore
    # encountered an issue. See stack trace (above)…"), waiting a moment for the dying engine's own
    # failure to be reported; empty otherwise.
    known_cause: Callable[[str], Awaitable[str]] = attrs.field(default=_no_cause, repr=False, eq=False)


class Routes:
    """Secrets by shard, endpoints the gateway found dead, and each replica's `lost` signal."""

    def __init__(self, clock: Callable[[], float], retry_s: float) -> None:
        self._clock = clock
        self._retry_s = retry_s
        self._secrets: dict[str, str] = {}
        # shard id -> clock time the gateway last failed to connect to its engine.
        self._refused: dict[str, float] = {}
        self._lost: dict[str, asyncio.Future[str]] = {}

    def remember(self, shard_id: str, secret: str) -> None:
        """Keep a replica's secret; an empty one (a report that did not carry it) changes nothing."""
        if secret:
            self._secrets[shard_id] = secret

    def secret(self, shard_id: str) -> str:
        return self._secrets.get(shard_id, "")

    def keep_only(self, shard_ids: Iterable[str]) -> None:
        """Forget what belongs to replicas no longer known."""
        live = set(shard_ids)
        self._secrets = {k: v for k, v in self._secrets.items() if k in live}
        self._refused = {k: v for k, v in self._refused.items() if k in live}
        self._lost = {k: v for k, v in self._lost.items() if k in live}

    def refuse(self, shard_id: str) -> None:
        self._refused[shard_id] = self._clock()

    def ready_again(self, shard_id: str) -> None:
        """The agent says the engine is ready: route to it again."""
        self._refused.pop(shard_id, None)

    def routable(self, shard_id: str) -> bool:
        """False for an engine the gateway could not reach, until its agent says it is ready (or retry)."""
        return shard_id not in self._refused

    def retry(self, agent_connected: Callable[[str], bool]) -> bool:
        """Route again to engines refused retry_s ago on nodes whose agent is connected; whether any.

        While the agent is down nobody will say the engine is back, and it stays out. While it
        is connected it reports an engine that died at once, so a refusal it did not follow
        with a report was a passing fault (or a firewall): worth one more request now and then.
        """
        now = self._clock()
        due = [s for s, since in self._refused.items() if now - since >= self._retry_s and agent_connected(s)]
        for shard_id in due:
            del self._refused[shard_id]
        return bool(due)

    def lost(self, shard_id: str) -> asyncio.Future[str]:
        """The future that resolves when shard_id's engine is given up for lost; needs a running loop."""
        future = self._lost.get(shard_id)
        if future is None or future.done():
            future = self._lost[shard_id] = asyncio.get_running_loop().create_future()
        return future

    def lose(self, shard_id: str, reason: str) -> None:
        """Abandon every request in flight to shard_id's engine, saying reason."""
        future = self._lost.pop(shard_id, None)
        if future is not None and not future.done():
            future.set_result(reason)
