"""Asking a node for its logs over the stream it already holds, and waiting for the answer.

Seeing what a node did used to mean ssh through a jump host to a journal only
root may read. The agent keeps its recent lines in memory and answers a
LogsRequest on its stream; this is the control plane's end: a request id per
question, a future per request id, resolved by the stream's receive loop.
Several requests may be in flight at once, to one node or many.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Awaitable, Callable

import attrs
import structlog

from llmgw.errors import LlmgwError
from llmgw.log import AGENT_RING_LINES
from llmgw.proto.llmgw import v1 as pb

log = structlog.get_logger(__name__)

# A page is waiting on the answer, and an agent that does not know LogsRequest never sends one.
ANSWER_TIMEOUT_S = 10.0
# What a request without a line count gets, and the most one may ask for: the agent keeps no more.
DEFAULT_LINES = 300
MAX_LINES = AGENT_RING_LINES

Send = Callable[[str, pb.ControlMessage], Awaitable[None]]


class NoAnswer(LlmgwError):
    """The node did not answer a log request in time."""


@attrs.frozen
class NodeLog:
    """One of a node's logs, as the node sent it; error says why there are no lines."""

    node: str
    source: str
    lines: list[str]
    # Every log the node can show; empty only when the node never answered.
    sources: list[str]
    error: str = ""


class LogRequests:
    """The log requests waiting for their node's reply, by request id."""

    def __init__(self, send: Send, timeout_s: float = ANSWER_TIMEOUT_S) -> None:
        self._send = send
        self.timeout_s = timeout_s
        self._ids = itertools.count(1)
        self._waiting: dict[str, tuple[str, asyncio.Future[pb.LogsReply]]] = {}

    def pending(self) -> int:
        """How many requests still wait for their reply."""
        return len(self._waiting)

    async def fetch(self, node_id: str, source: str, lines: int, timeout_s: float | None = None) -> NodeLog:
        """Ask node_id for the last lines of source ("agent" or a shard id).

        Raises NodeNotConnected when the node has no stream, NoAnswer when it
        does not reply within the timeout; a node that answers with an error
        (an unknown source) gives a NodeLog whose error says so.
        """
        source = source or "agent"
        request_id = f"logs-{next(self._ids)}"
        future: asyncio.Future[pb.LogsReply] = asyncio.get_running_loop().create_future()
        self._waiting[request_id] = (node_id, future)
        wait_s = self.timeout_s if timeout_s is None else timeout_s
        try:
            await self._send(
                node_id,
                pb.ControlMessage(logs=pb.LogsRequest(request_id=request_id, source=source, lines=lines)),
            )
            try:
                reply = await asyncio.wait_for(future, wait_s)
            except TimeoutError:
                raise NoAnswer(f"node {node_id} did not answer within {wait_s:g} s") from None
        finally:
            self._waiting.pop(request_id, None)
        return NodeLog(
            node=node_id,
            source=source,
            lines=list(reply.lines),
            sources=list(reply.sources),
            error=reply.error,
        )

    def resolve(self, node_id: str, reply: pb.LogsReply) -> None:
        """Hand a reply from node_id's stream to whoever asked; called on the receive loop, never waits."""
        waiting = self._waiting.get(reply.request_id)
        if waiting is None:
            # The asker gave up (timed out, or the page was closed): nothing left to tell.
            return
        asked, future = waiting
        if asked != node_id:
            # A node answering another node's request is a bug or a lie; either way not the answer.
            log.warning(
                "a node answered a log request meant for another",
                node=node_id,
                asked=asked,
                request=reply.request_id,
            )
            return
        del self._waiting[reply.request_id]
        if not future.done():
            future.set_result(reply)
