"""The agent's answer to a LogsRequest: its own recent lines, or an engine's.

The control plane cannot guess a node's logs (shard ids are made up at
placement), so every reply lists them all, and the page or `llmgw ctl logs`
can offer them without a second question.
"""

from __future__ import annotations

from typing import Protocol

from llmgw.log import AGENT_RING_LINES, LogRing
from llmgw.proto.llmgw import v1 as pb

AGENT_SOURCE = "agent"
# What a request that names no count gets: a screenful and a little more.
DEFAULT_LINES = 200


class LogSources(Protocol):
    """What answering needs of agent/supervisor.py's Supervisor."""

    def output(self, shard_id: str) -> list[str]: ...

    def sources(self) -> list[str]: ...


def answer(req: pb.LogsRequest, ring: LogRing, engines: LogSources) -> pb.LogsReply:
    """The reply to req: cheap, never waits, so it can be built on the stream's receive loop."""
    count = req.lines if req.lines > 0 else DEFAULT_LINES
    count = min(count, AGENT_RING_LINES)
    shards = sorted(engines.sources())
    reply = pb.LogsReply(request_id=req.request_id, sources=[AGENT_SOURCE, *shards])
    source = req.source or AGENT_SOURCE
    if source == AGENT_SOURCE:
        reply.lines = ring.tail(count)
    elif source in shards:
        lines = engines.output(source)
        reply.lines = lines[max(0, len(lines) - count) :]
    else:
        reply.error = f"no engine {source} runs on this node"
    return reply
