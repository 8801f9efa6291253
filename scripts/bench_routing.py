#!/usr/bin/env python3
"""Routing policies side by side: two real llama-server replicas, a multi-turn chat workload.

Writes a small random-weight llama model (make_tiny_gguf.py's, wider and deeper so that
prefill dominates), starts two llama-server replicas of it with the llama.cpp adapter's command
line, and puts the gateway (in this process, no auth) in front of them. For each `router.policy`,
with a fresh gateway, it runs the same workload: conversations sharing a long system prompt, each
turn adding the reply and a new user message to the history, one request every 1/rate seconds
(to the next conversation whose previous turn has come back). Each policy's conversations start
with their own words, so one policy never finds another's prompts in the engines' caches.

Prints, per policy: time to first token p50/p95, throughput, and the engines' cache figures:
prompt tokens the engines processed (llama.cpp's `timings.prompt_n`) against prompt tokens sent.
`affinity` sends each conversation's id as `user`; `prefix` sends none, so it is placed by its
prompt alone. Then, with --decision, the router's own CPU time per decision and the prefix
index's memory. A measurement, not a test: nothing here asserts a time.

    python scripts/bench_routing.py [--rate 1.0] [--conversations 12] [--turns 4] [--rounds 2] [--decision]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import socket
import statistics
import sys
import tempfile
import time
import tracemalloc
from collections.abc import AsyncIterator, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import attrs
from aiohttp import web
from aiohttp.test_utils import make_mocked_request

sys.path.insert(0, str(Path(__file__).parent))
import make_tiny_gguf

from llmgw import config
from llmgw.catalog import Catalog
from llmgw.config import AuthConfig, ModelConfig, RouterConfig, ServerConfig
from llmgw.engines.base import LaunchSpec
from llmgw.engines.llamacpp import LlamaCppEngine
from llmgw.gateway.affinity import PrefixIndex, prompt_blocks
from llmgw.gateway.app import make_gateway_app
from llmgw.gateway.auth import KeyCache
from llmgw.gateway.pipeline import Call
from llmgw.gateway.router import Router
from llmgw.routes import EngineRoute

MODEL = "bench-chat"
POLICIES = ("least_in_flight", "affinity", "prefix")
CACHE = Path(os.environ.get("LLMGW_BUILD_CACHE", Path.home() / ".cache" / "llmgw" / "llama-server"))
_WORDS = [
    "refund",
    "shipping",
    "invoice",
    "parcel",
    "warranty",
    "courier",
    "address",
    "payment",
    "order",
    "return",
    "label",
    "customer",
    "receipt",
    "delivery",
    "exchange",
    "damaged",
    "missing",
    "account",
    "balance",
    "discount",
    "voucher",
]


@attrs.define
class _Replicas:
    endpoints: list[str]

    def ready_endpoints(self, model: str) -> Sequence[str]:
        return self.endpoints

    def why_no_ready(self, model: str) -> str:
        return "the bench's replicas are not running"

    def route(self, endpoint: str) -> EngineRoute | None:
        return None


def _build() -> Path:
    builds = [d for d in CACHE.iterdir() if d.name.isdigit() and (d / "bin" / "llama-server").is_file()]
    if not builds:
        raise SystemExit(f"no llama-server build under {CACHE}: run scripts/build-llama-server.sh first")
    return max(builds, key=lambda d: int(d.name))


def _model(build: Path, out: Path) -> Path:
    # 256 wide, 4 layers: a 1,500-token prompt takes most of a second to prefill on one core,
    # and a cached one a tenth of that, so what routing saves is larger than the noise.
    make_tiny_gguf.EMBEDDING, make_tiny_gguf.LAYERS, make_tiny_gguf.FEED_FORWARD = 256, 4, 768
    make_tiny_gguf.CONTEXT = 8192
    return make_tiny_gguf.write_tiny_gguf(out, build / "ggml-vocab-llama-spm.gguf", name="bench")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@asynccontextmanager
async def _llama_server(build: Path, model: Path, log: Path, threads: int, slots: int) -> AsyncIterator[str]:
    engine = LlamaCppEngine()
    spec = LaunchSpec(
        model=MODEL,
        port=_free_port(),
        model_path=str(model),
        # llama-server keeps one prompt's cache per slot, and gives a request the slot whose cache
        # matches it best: with a slot per conversation it has, a replica can hold them all.
        context_size=4096 * slots,
        parallel=slots,
        binary=str(build / "bin" / "llama-server"),
        args=("--threads", str(threads)),
    )
    with log.open("wb") as out:
        process = await asyncio.create_subprocess_exec(
            *engine.command(spec),
            env={**os.environ, **engine.environment(spec)},
            stdin=asyncio.subprocess.DEVNULL,
            stdout=out,
            stderr=asyncio.subprocess.STDOUT,
            start_new_session=True,
        )
    base = f"http://{spec.host}:{spec.port}"
    try:
        async with aiohttp.ClientSession() as session:
            for _ in range(1200):
                if process.returncode is not None:
                    raise SystemExit(f"llama-server exited with {process.returncode}; see {log}")
                try:
                    async with session.get(base + "/health") as reply:
                        if reply.status == 200:
                            break
                except aiohttp.ClientConnectionError:
                    pass
                await asyncio.sleep(0.1)
            else:
                raise SystemExit(f"llama-server did not become healthy in 120 s; see {log}")
        yield base
    finally:
        if process.returncode is None:
            os.killpg(process.pid, signal.SIGTERM)
            await process.wait()


def _system_prompt(tag: str) -> str:
    rng = random.Random(tag)
    policy = " ".join(rng.choice(_WORDS) for _ in range(900))
    return f"Deployment {tag}. You are the support assistant of a shop. Policy: {policy}"


def _user_turn(rng: random.Random, conversation: int, turn: int) -> str:
    return f"Conversation {conversation}, question {turn}: " + " ".join(
        rng.choice(_WORDS) for _ in range(150)
    )


@attrs.define
class _Result:
    ttft: list[float] = attrs.field(factory=list)
    prompt_tokens: int = 0
    processed: int = 0
    completion_tokens: int = 0
    done: int = 0
    skipped_ticks: int = 0
    errors: int = 0
    seconds: float = 0.0


async def _one(session: aiohttp.ClientSession, url: str, body: dict[str, Any], result: _Result) -> str:
    """Send one streamed turn; the reply's text."""
    start = time.perf_counter()
    first: float | None = None
    text: list[str] = []
    async with session.post(url + "/v1/chat/completions", json=body) as reply:
        if reply.status != 200:
            result.errors += 1
            return ""
        async for line in reply.content:
            if not line.startswith(b"data: ") or line.startswith(b"data: [DONE]"):
                continue
            chunk = json.loads(line[6:])
            for choice in chunk.get("choices") or ():
                piece = (choice.get("delta") or {}).get("content")
                if piece:
                    if first is None:
                        first = time.perf_counter()
                    text.append(piece)
            if usage := chunk.get("usage"):
                result.prompt_tokens += usage["prompt_tokens"]
                result.completion_tokens += usage["completion_tokens"]
            if timings := chunk.get("timings"):
                result.processed += timings.get("prompt_n", 0)
    result.ttft.append((first if first is not None else time.perf_counter()) - start)
    result.done += 1
    return "".join(text)


async def _workload(url: str, tag: str, args: argparse.Namespace, send_user: bool) -> _Result:
    rng = random.Random(tag)
    system = _system_prompt(tag)
    histories: list[list[dict[str, str]]] = [
        [{"role": "system", "content": system}] for _ in range(args.conversations)
    ]
    turns_left = [args.turns] * args.conversations
    ready: list[int] = list(range(args.conversations))
    result = _Result()
    tasks: set[asyncio.Task[None]] = set()
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as session:

        async def turn(c: int) -> None:
            histories[c].append({"role": "user", "content": _user_turn(rng, c, args.turns - turns_left[c])})
            body: dict[str, Any] = {
                "model": MODEL,
                "messages": histories[c],
                "max_tokens": args.max_tokens,
                "temperature": 0,
                "stream": True,
                "stream_options": {"include_usage": True},
            }
            if send_user:
                body["user"] = f"{tag}-conversation-{c}"
            text = await _one(session, url, body, result)
            histories[c].append({"role": "assistant", "content": text})
            turns_left[c] -= 1
            if turns_left[c]:
                ready.append(c)

        start = time.perf_counter()
        tick = 0
        while any(turns_left) or tasks:
            if ready:
                task = asyncio.create_task(turn(ready.pop(0)))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
            elif any(turns_left):
                result.skipped_ticks += 1
            tick += 1
            # A fixed rate: the next request at its own time, however long the others take.
            await asyncio.sleep(max(0.0, start + tick / args.rate - time.perf_counter()))
            if not any(turns_left) and tasks:
                await asyncio.gather(*tasks)
        result.seconds = time.perf_counter() - start
    return result


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def _engines(args: argparse.Namespace) -> dict[str, _Result]:
    build = _build()
    results: dict[str, _Result] = {}
    with tempfile.TemporaryDirectory(prefix="bench-routing-") as tmp:
        work = Path(tmp)
        model = await asyncio.to_thread(_model, build, work / "bench.gguf")
        async with AsyncExitStack() as stack:
            endpoints = [
                await stack.enter_async_context(
                    _llama_server(
                        build, model, work / f"engine-{i}.log", args.engine_threads, args.engine_slots
                    )
                )
                for i in range(2)
            ]
            for round_ in range(args.rounds):
                for policy in POLICIES:
                    cfg = ServerConfig(
                        models=[ModelConfig(name=MODEL)],
                        auth=AuthConfig(enabled=False),
                        router=config.evolve(RouterConfig(), policy=policy),
                    )
                    app = make_gateway_app(cfg, Catalog(cfg), _Replicas(endpoints), KeyCache())
                    runner = web.AppRunner(app)
                    await runner.setup()
                    site = web.TCPSite(runner, "127.0.0.1", 0)
                    await site.start()
                    port = runner.addresses[0][1]
                    try:
                        tag = f"{policy}-{round_}-{args.seed}"
                        got = await _workload(f"http://127.0.0.1:{port}", tag, args, policy != "prefix")
                    finally:
                        await runner.cleanup()
                    total = results.setdefault(policy, _Result())
                    total.ttft += got.ttft
                    total.prompt_tokens += got.prompt_tokens
                    total.processed += got.processed
                    total.completion_tokens += got.completion_tokens
                    total.done += got.done
                    total.errors += got.errors
                    total.skipped_ticks += got.skipped_ticks
                    total.seconds += got.seconds
                    print(
                        f"  {policy} round {round_ + 1}: {got.done} requests, {got.errors} errors", flush=True
                    )
    return results


def _decision(blocks_capacity: int) -> None:
    """CPU time of one routing decision per policy, and the prefix index's memory per block."""
    catalog = Catalog(ServerConfig(models=[ModelConfig(name=MODEL)]))
    endpoints = ["http://127.0.0.1:1", "http://127.0.0.1:2"]
    rng = random.Random(1)
    system = _system_prompt("decision")
    payloads = []
    for c in range(64):
        messages = [{"role": "system", "content": system}]
        for t in range(rng.randint(1, 5)):
            messages += [
                {"role": "user", "content": _user_turn(rng, c, t)},
                {"role": "assistant", "content": "ok"},
            ]
        payloads.append({"model": MODEL, "messages": messages, "user": f"user-{c}"})
    raws = [json.dumps(payload) for payload in payloads]
    request = make_mocked_request("POST", "/v1/chat/completions")
    print(
        "\nRouter decision, CPU time (session key, prompt hashes, choice, release), µs, p50 of 100 batches:"
    )
    for policy, with_user in (("least_in_flight", True), ("affinity", True), ("prefix", False)):
        router = Router(catalog, _Replicas(endpoints), config.evolve(RouterConfig(), policy=policy))
        per_call = []
        for _ in range(100):
            # Parsed afresh, untimed, as each request's are: Python caches a string's hash on the
            # string, and a prompt hashed once before would be free the second time.
            calls = []
            for raw in raws:
                payload = json.loads(raw)
                if not with_user:
                    del payload["user"]
                calls.append(Call(request, payload=payload, model=MODEL))
            start = time.thread_time_ns()
            for call in calls:
                session = router.session_of(call)
                blocks = prompt_blocks(MODEL, call.payload) if policy == "prefix" and not session else []
                router.release(router.route(MODEL, session, blocks)[1])
            per_call.append((time.thread_time_ns() - start) / len(calls) / 1000)
        chars = statistics.mean(sum(len(m["content"]) for m in p["messages"]) for p in payloads)
        print(f"  {policy:16} {statistics.median(per_call):7.2f}   (prompts of {chars:,.0f} characters)")
    tracemalloc.start()
    index = PrefixIndex(blocks_capacity)
    before = tracemalloc.get_traced_memory()[0]
    i = 0
    while len(index) < blocks_capacity:
        index.record(prompt_blocks(MODEL, {"prompt": f"{i:08d}" * 128 * 64}), endpoints[i % 2])
        i += 1
    used = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    print(
        f"\nPrefix index full at {blocks_capacity:,} entries: {used / 2**20:.1f} MiB "
        f"({used / blocks_capacity:.0f} bytes an entry)"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--rate", type=float, default=1.0, help="requests per second (default 1)")
    parser.add_argument("--conversations", type=int, default=12, help="conversations per policy")
    parser.add_argument("--turns", type=int, default=4, help="user turns per conversation")
    parser.add_argument("--max-tokens", type=int, default=16, help="completion tokens per turn")
    parser.add_argument("--rounds", type=int, default=1, help="times each policy runs, in turn")
    parser.add_argument("--engine-threads", type=int, default=1, help="llama-server --threads")
    parser.add_argument("--engine-slots", type=int, default=8, help="llama-server -np (parallel slots)")
    parser.add_argument("--seed", type=int, default=0, help="varies the words of every prompt")
    parser.add_argument("--decision", action="store_true", help="also time the router's decision")
    parser.add_argument("--no-engines", action="store_true", help="only the decision and the index")
    parser.add_argument("--index-entries", type=int, default=RouterConfig().prefix_index_entries)
    args = parser.parse_args(argv)
    if not args.no_engines:
        print(
            f"{args.conversations} conversations x {args.turns} turns per policy, {args.rate} requests/s, "
            f"{args.rounds} round(s), two llama-server replicas",
            flush=True,
        )
        results = asyncio.run(_engines(args))
        print(
            f"\n{'policy':16} {'TTFT p50':>9} {'TTFT p95':>9} {'req/s':>6} {'tok/s':>6} "
            f"{'processed/prompt tokens':>24} {'errors':>6}"
        )
        for policy, r in results.items():
            share = r.processed / r.prompt_tokens if r.prompt_tokens else 0.0
            print(
                f"{policy:16} {_quantile(r.ttft, 0.5) * 1000:7.0f}ms {_quantile(r.ttft, 0.95) * 1000:7.0f}ms "
                f"{r.done / r.seconds:6.2f} {r.completion_tokens / r.seconds:6.1f} "
                f"{r.processed:>10,}/{r.prompt_tokens:<10,} {share:4.0%} {r.errors:>3}"
            )
    if args.decision or args.no_engines:
        _decision(args.index_entries)
    return 0


if __name__ == "__main__":
    sys.exit(main())
