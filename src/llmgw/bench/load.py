"""Holding a concurrency against the gateway: streaming chat requests, each timed token by token.

Measured at the client, through the gateway, as an application sees it: the
time to the first token includes the gateway's admission and routing, not only
the engine's prefill.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import time
from typing import Any

import aiohttp
import attrs

from llmgw.bench.engineload import EngineLoad
from llmgw.bench.result import Level

# A request that has produced nothing for this long is counted as failed rather than left to hold
# the level open forever (an engine that hangs is exactly what a benchmark may meet).
REQUEST_TIMEOUT_S = 300.0


@attrs.define
class Tally:
    """What the requests of one level did, as they end."""

    ttft_s: list[float] = attrs.field(factory=list)
    itl_s: list[float] = attrs.field(factory=list)
    output_tokens: int = 0
    requests: int = 0
    errors: int = 0
    error: str = ""

    def fail(self, why: str) -> None:
        self.errors += 1
        if not self.error:
            self.error = why


@attrs.frozen
class Offer:
    """The load: where to send it, as whom, and what each request asks for."""

    url: str
    key: str | None
    model: str
    prompt_tokens: int
    max_tokens: int

    def body(self) -> dict[str, Any]:
        # Words the sim engine counts one a token, and real tokenisers about one a token too.
        prompt = " ".join(["hello"] * self.prompt_tokens)
        return {
            "model": self.model,
            "messages": [{"role": "user", "content": prompt}],
            "max_tokens": self.max_tokens,
            "stream": True,
            # The engine's own count of what it produced, rather than a guess from chunks.
            "stream_options": {"include_usage": True},
        }

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.key}"} if self.key else {}


def _message(status: int, text: str) -> str:
    try:
        error = json.loads(text).get("error")
        message = error.get("message") if isinstance(error, dict) else error
    except (ValueError, AttributeError):
        message = None
    return f"HTTP {status}: {message or text[:200] or 'no body'}"


async def _read_stream(reply: aiohttp.ClientResponse, sent: float, tally: Tally) -> None:
    first: float | None = None
    last = sent
    chunks = 0
    usage: int | None = None
    async for raw in reply.content:
        line = raw.strip()
        if not line.startswith(b"data:"):
            continue
        data = line[len(b"data:") :].strip()
        if data == b"[DONE]":
            break
        chunk = json.loads(data)
        if chunk.get("error"):
            tally.fail(_message(reply.status, data.decode(errors="replace")))
            return
        if isinstance(chunk.get("usage"), dict):
            usage = chunk["usage"].get("completion_tokens")
        if any((c.get("delta") or {}).get("content") for c in chunk.get("choices") or []):
            last = time.monotonic()
            first = last if first is None else first
            chunks += 1
    tokens = usage if isinstance(usage, int) else chunks
    tally.requests += 1
    tally.output_tokens += tokens
    if first is not None:
        tally.ttft_s.append(first - sent)
        if tokens > 1:
            tally.itl_s.append((last - first) / (tokens - 1))


async def _one(session: aiohttp.ClientSession, offer: Offer, body: dict[str, Any], tally: Tally) -> None:
    sent = time.monotonic()
    try:
        async with session.post(offer.url, json=body, headers=offer.headers()) as reply:
            if reply.status != 200:
                tally.fail(_message(reply.status, await reply.text()))
                return
            await _read_stream(reply, sent, tally)
    except (aiohttp.ClientError, TimeoutError) as exc:
        tally.fail(f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__)
    except ValueError as exc:
        tally.fail(f"a chunk of the stream is not JSON: {exc}")


async def hold(offer: Offer, concurrency: int, seconds: float) -> tuple[Tally, float]:
    """Keep concurrency requests in flight for seconds; what they did, and the seconds it took.

    A request sent before the end runs to its end: the level lasts until the last one does. Each of
    the concurrency workers sends at least one, so that a short level on a busy machine, whose seconds
    ran out before its workers began, still measures something rather than report no request at all.
    """
    tally = Tally()
    body = offer.body()
    timeout = aiohttp.ClientTimeout(total=None, sock_read=REQUEST_TIMEOUT_S)
    connector = aiohttp.TCPConnector(limit=concurrency)
    start = time.monotonic()
    deadline = start + seconds

    async def worker() -> None:
        await _one(session, offer, body, tally)
        while time.monotonic() < deadline:
            await _one(session, offer, body, tally)

    async with (
        aiohttp.ClientSession(timeout=timeout, connector=connector) as session,
        asyncio.TaskGroup() as group,
    ):
        for _ in range(concurrency):
            group.create_task(worker())
    return tally, time.monotonic() - start


def _ms(value: float | None) -> float | None:
    return round(value * 1000.0, 3) if value is not None else None


def _quantile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[round(q * 100) - 1]


def level(concurrency: int, tally: Tally, seconds: float, engine: EngineLoad, readings: int) -> Level:
    """The level's figures from its tally and the engine's peak load."""
    return Level(
        concurrency=concurrency,
        requests=tally.requests,
        errors=tally.errors,
        error=tally.error,
        seconds=round(seconds, 3),
        output_tokens=tally.output_tokens,
        ttft_p50_ms=_ms(_quantile(tally.ttft_s, 0.5)),
        ttft_p95_ms=_ms(_quantile(tally.ttft_s, 0.95)),
        itl_p50_ms=_ms(_quantile(tally.itl_s, 0.5)),
        output_tokens_per_s=round(tally.output_tokens / seconds, 3) if seconds > 0 else 0.0,
        requests_per_s=round(tally.requests / seconds, 3) if seconds > 0 else 0.0,
        queue_depth_max=engine.queue_depth,
        kv_cache_max=engine.kv_cache,
        engine_readings=readings,
    )
