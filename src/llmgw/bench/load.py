"""Holding a concurrency against the gateway: streaming chat requests, each timed chunk by chunk.

Measured at the client, through the gateway, as an application sees it: the
time to the first token includes the gateway's admission and routing, not only
the engine's prefill. The figures are those of vLLM's benchmark_serving and
llmperf: TTFT (sent to the first content chunk), ITL (the gaps between content
chunks), TPOT ((end to end - TTFT) / (output tokens - 1), per request) and end
to end; the tokens are the engine's own count (`stream_options.include_usage`).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import statistics
import time
from collections.abc import AsyncIterable, Callable
from typing import Any

import aiohttp
import attrs

from llmgw.bench.engineload import EngineLoad
from llmgw.bench.result import Level

# A request that has produced nothing for this long is counted as failed rather than left to hold
# the level open forever (an engine that hangs is exactly what a benchmark may meet).
REQUEST_TIMEOUT_S = 300.0
# The gateway's header naming the catalog model that served the call (gateway/proxy.py).
MODEL_HEADER = "x-llmgw-model"

Clock = Callable[[], float]


@attrs.frozen
class Timed:
    """One request that streamed to its end: its times in seconds and the engine's counts."""

    ttft_s: float | None
    itl_s: list[float]
    e2e_s: float
    # None where the stream carried no usage: then the output is the content chunks counted.
    input_tokens: int | None
    output_tokens: int
    usage: bool

    @property
    def tpot_s(self) -> float | None:
        """Time per output token after the first; None for a reply of fewer than two tokens."""
        if self.ttft_s is None or self.output_tokens < 2:
            return None
        return (self.e2e_s - self.ttft_s) / (self.output_tokens - 1)


@attrs.define
class Tally:
    """What the requests of one level did, as they end."""

    ttft_s: list[float] = attrs.field(factory=list)
    tpot_s: list[float] = attrs.field(factory=list)
    itl_s: list[float] = attrs.field(factory=list)
    e2e_s: list[float] = attrs.field(factory=list)
    input_tokens: int = 0
    output_tokens: int = 0
    without_usage: int = 0
    requests: int = 0
    errors: int = 0
    error: str = ""
    # The catalog models that served the requests: the one asked for, or its fallbacks.
    served: set[str] = attrs.field(factory=set)

    def fail(self, why: str) -> None:
        self.errors += 1
        if not self.error:
            self.error = why

    def add(self, timed: Timed) -> None:
        self.requests += 1
        self.e2e_s.append(timed.e2e_s)
        self.itl_s.extend(timed.itl_s)
        self.output_tokens += timed.output_tokens
        self.input_tokens += timed.input_tokens or 0
        self.without_usage += 0 if timed.usage else 1
        if timed.ttft_s is not None:
            self.ttft_s.append(timed.ttft_s)
        if timed.tpot_s is not None:
            self.tpot_s.append(timed.tpot_s)


@attrs.frozen
class Offer:
    """The load: where to send it, as whom, and what each request asks for."""

    url: str
    key: str | None
    model: str
    prompt_words: int
    max_tokens: int

    def body(self) -> dict[str, Any]:
        # Words, not tokens: how many tokens they make is the engine's to say, and its usage says it
        # (a 128-word prompt was 650 tokens on a tiny vLLM model).
        prompt = " ".join(["hello"] * self.prompt_words)
        return {
            "model": self.model,
            "messages": [{"role": "user", "content": prompt}],
            "max_tokens": self.max_tokens,
            "stream": True,
            # The engine's own count of what it read and produced, rather than a guess from chunks.
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


def _count(usage: object, name: str) -> int | None:
    value = usage.get(name) if isinstance(usage, dict) else None
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


async def read_stream(lines: AsyncIterable[bytes], sent: float, clock: Clock) -> Timed | str:
    """One reply's server-sent events timed by clock from sent; the error's words if it carried one.

    A chunk counts as a token's arrival when it carries content: the role chunk before and the usage
    chunk after are not tokens, and timing them would flatter TTFT and ITL.
    """
    arrivals: list[float] = []
    usage: object = None
    async for raw in lines:
        line = raw.strip()
        if not line.startswith(b"data:"):
            continue
        data = line[len(b"data:") :].strip()
        if data == b"[DONE]":
            break
        chunk = json.loads(data)
        if not isinstance(chunk, dict):
            raise ValueError(f"{data[:80]!r} is not an object")
        if chunk.get("error"):
            return _message(200, data.decode(errors="replace"))
        if isinstance(chunk.get("usage"), dict):
            usage = chunk["usage"]
        if any(
            isinstance(c, dict) and (c.get("delta") or {}).get("content") for c in chunk.get("choices") or []
        ):
            arrivals.append(clock())
    end = clock()
    completion = _count(usage, "completion_tokens")
    return Timed(
        ttft_s=arrivals[0] - sent if arrivals else None,
        itl_s=[b - a for a, b in itertools.pairwise(arrivals)],
        e2e_s=end - sent,
        input_tokens=_count(usage, "prompt_tokens"),
        output_tokens=completion if completion is not None else len(arrivals),
        usage=completion is not None,
    )


async def _one(session: aiohttp.ClientSession, offer: Offer, body: dict[str, Any], tally: Tally) -> None:
    sent = time.monotonic()
    try:
        async with session.post(offer.url, json=body, headers=offer.headers()) as reply:
            if reply.status != 200:
                tally.fail(_message(reply.status, await reply.text()))
                return
            timed = await read_stream(reply.content, sent, time.monotonic)
            if isinstance(timed, str):
                tally.fail(timed)
                return
            tally.add(timed)
            tally.served.add(reply.headers.get(MODEL_HEADER) or offer.model)
    except (aiohttp.ClientError, TimeoutError) as exc:
        tally.fail(f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__)
    except ValueError as exc:
        tally.fail(f"a chunk of the stream is not JSON: {exc}")


def _session(concurrency: int) -> aiohttp.ClientSession:
    timeout = aiohttp.ClientTimeout(total=None, sock_read=REQUEST_TIMEOUT_S)
    return aiohttp.ClientSession(timeout=timeout, connector=aiohttp.TCPConnector(limit=concurrency))


async def probe(offer: Offer) -> Tally:
    """One request of the load, unmeasured: whether the gateway serves the model, and through which."""
    async with _session(1) as session:
        tally = Tally()
        await _one(session, offer, offer.body(), tally)
        return tally


async def hold(offer: Offer, concurrency: int, seconds: float, served: set[str]) -> tuple[Tally, float]:
    """Keep concurrency requests in flight for seconds; what they did, and the seconds it took.

    served gets the models that answered as they answer (the caller reads it meanwhile).

    A request sent before the end runs to its end: the level lasts until the last one does. Each of
    the concurrency workers sends at least one, so that a short level on a busy machine, whose seconds
    ran out before its workers began, still measures something rather than report no request at all.
    """
    tally = Tally(served=served)
    body = offer.body()
    start = time.monotonic()
    deadline = start + seconds

    async def worker() -> None:
        await _one(session, offer, body, tally)
        while time.monotonic() < deadline:
            await _one(session, offer, body, tally)

    async with _session(concurrency) as session, asyncio.TaskGroup() as group:
        for _ in range(concurrency):
            group.create_task(worker())
    return tally, time.monotonic() - start


def _ms(value: float | None) -> float | None:
    return round(value * 1000.0, 3) if value is not None else None


def quantile(values: list[float], q: float) -> float | None:
    """The q quantile of values, interpolated between the nearest two (as numpy's default)."""
    if not values:
        return None
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[round(q * 100) - 1]


def _per_s(amount: int, seconds: float) -> float:
    return round(amount / seconds, 3) if seconds > 0 else 0.0


def level(concurrency: int, tally: Tally, seconds: float, engine: EngineLoad, readings: int) -> Level:
    """The level's figures from its tally and the engine's peak load."""

    def at(values: list[float], q: float) -> float | None:
        return _ms(quantile(values, q))

    return Level(
        concurrency=concurrency,
        requests=tally.requests,
        errors=tally.errors,
        error=tally.error,
        seconds=round(seconds, 3),
        output_tokens=tally.output_tokens,
        ttft_p50_ms=at(tally.ttft_s, 0.5),
        ttft_p95_ms=at(tally.ttft_s, 0.95),
        itl_p50_ms=at(tally.itl_s, 0.5),
        output_tokens_per_s=_per_s(tally.output_tokens, seconds),
        requests_per_s=_per_s(tally.requests, seconds),
        queue_depth_max=engine.queue_depth,
        kv_cache_max=engine.kv_cache,
        engine_readings=readings,
        input_tokens=tally.input_tokens,
        requests_without_usage=tally.without_usage,
        # Unknown, not the output alone, when no reply said what it read.
        total_tokens_per_s=None
        if tally.requests and tally.without_usage == tally.requests
        else _per_s(tally.input_tokens + tally.output_tokens, seconds),
        ttft_p99_ms=at(tally.ttft_s, 0.99),
        tpot_p50_ms=at(tally.tpot_s, 0.5),
        tpot_p95_ms=at(tally.tpot_s, 0.95),
        tpot_p99_ms=at(tally.tpot_s, 0.99),
        itl_p95_ms=at(tally.itl_s, 0.95),
        itl_p99_ms=at(tally.itl_s, 0.99),
        e2e_p50_ms=at(tally.e2e_s, 0.5),
        e2e_p95_ms=at(tally.e2e_s, 0.95),
        e2e_p99_ms=at(tally.e2e_s, 0.99),
    )
