#!/usr/bin/env python3
"""Routing policies side by side: two real llama-server replicas, a multi-turn chat workload.

Writes a small random-weight llama model (make_tiny_gguf.py's, wider and deeper so that
prefill dominates), starts two llama-server replicas of it with the llama.cpp adapter's command
line, and puts the gateway (in this process, no auth) in front of them. For each `router.policy`,
with a fresh gateway, it runs the same workload: conversations sharing a long system prompt, each
turn adding the reply and a new user message to the history, one request every 1/rate seconds
(to a ready conversation, one whose previous turn has come back, taken at random). Every run
shares the deployment's system prompt, which every slot holds before the first (as on a replica
that has been serving it); each policy's conversations have their own words, so one policy never
finds another's conversations in the engines' caches.

Two workloads: `coding` (the default), an assistant to which each user turn pastes 300 to 900
tokens of code, so that a conversation's history outgrows the shared system prompt turn by turn;
and `support`, short questions under a long shared policy, where the history stays small.

Prints, per policy: time to first token p50/p95, where it went (the engine's own prefill time,
`timings.prompt_ms`, and the rest: the wait for a slot, the gateway, the first token), throughput,
and the engines' cache figures: prompt tokens the engines processed (llama.cpp's
`timings.prompt_n`) against prompt tokens sent, and the later turns whose prefill reached back
into the conversation's history (the engine that served it no longer held the previous turn).
`affinity` sends each conversation's id as `user`; `prefix` sends none, so it is placed by its
prompt alone. Then, with --decision, the router's own CPU time per decision and the prefix
index's memory. A measurement, not a test: nothing here asserts a time.

    python scripts/bench_routing.py [--workload coding|support] [--rate R] [--conversations N]
        [--turns N] [--rounds 2] [--policies least_in_flight,prefix]
        [--engine-arg=--cache-ram --engine-arg=0]
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
from collections.abc import AsyncIterator, Collection, Sequence
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
from llmgw.gateway.app import ROUTER_KEY, make_gateway_app
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
async def _llama_server(build: Path, model: Path, log: Path, args: argparse.Namespace) -> AsyncIterator[str]:
    engine = LlamaCppEngine()
    spec = LaunchSpec(
        model=MODEL,
        port=_free_port(),
        model_path=str(model),
        # Each slot gets its share of the context: enough for a conversation's longest prompt.
        context_size=args.slot_context * args.engine_slots,
        parallel=args.engine_slots,
        binary=str(build / "bin" / "llama-server"),
        args=("--threads", str(args.engine_threads), *args.engine_arg),
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


@attrs.frozen
class _Workload:
    """What one conversation sends: its defaults, and the text of each message."""

    name: str
    conversations: int
    turns: int
    rate: float
    slots: int
    slot_context: int
    summary: str

    def system(self, tag: str) -> str:
        rng = random.Random(tag)
        if self.name == "support":
            policy = " ".join(rng.choice(_WORDS) for _ in range(900))
            return f"Deployment {tag}. You are the support assistant of a shop. Policy: {policy}"
        # About 1,100 tokens: the house rules a coding assistant is deployed with.
        rules = "\n".join(f"- {_code_line(rng)}" for _ in range(40))
        return f"Deployment {tag}. You are the coding assistant of a shop's engineers. House rules:\n{rules}"

    def user(self, rng: random.Random, conversation: int, turn: int) -> str:
        if self.name == "support":
            return f"Conversation {conversation}, question {turn}: " + " ".join(
                rng.choice(_WORDS) for _ in range(150)
            )
        # 11 to 32 lines of pasted code, about 28 tokens each: 300 to 900 tokens a turn.
        lines = "\n".join(_code_line(rng) for _ in range(rng.randint(11, 32)))
        return f"Conversation {conversation}, step {turn}: why does this fail?\n```python\n{lines}\n```"


def _code_line(rng: random.Random) -> str:
    a, b, c = (rng.choice(_WORDS) for _ in range(3))
    return f"    {a}_{b} = {c}.get_{a}({b}_id, limit={rng.randint(1, 999)})"


WORKLOADS = {
    # The first measurement's: 12 conversations x 4 turns of 150 words under a 900-word policy,
    # 8 slots of 4,096 tokens a replica (a slot for each conversation a replica serves).
    "support": _Workload("support", 12, 4, 1.0, 8, 4096, "150-word questions under a 900-word policy"),
    # 12 conversations, three times the adapter's 4 slots a replica, 6 turns of pasted code each: the
    # last turn's prompt is about 5,000 tokens, of which the shared rules are 1,100. At 0.75
    # request/s the shared 2-core machine fell behind; at 0.5 every policy kept up.
    "coding": _Workload("coding", 12, 6, 0.5, 4, 8192, "300-900 tokens of code a turn, 1,100-token rules"),
}


@attrs.define
class _Turn:
    conversation: int
    round: int = attrs.field(kw_only=True, default=0)
    turn: int
    ttft: float
    prompt_tokens: int
    processed: int
    prefill_ms: float


@attrs.define
class _Result:
    turns: list[_Turn] = attrs.field(factory=list)
    completion_tokens: int = 0
    skipped_ticks: int = 0
    errors: int = 0
    seconds: float = 0.0
    # Requests whose history (more than the system message) the prefix index remembered, and of
    # them those the load bound sent elsewhere than the replica that had served it.
    remembered: int = 0
    moved: int = 0

    @property
    def ttft(self) -> list[float]:
        return [t.ttft for t in self.turns]

    @property
    def prompt_tokens(self) -> int:
        return sum(t.prompt_tokens for t in self.turns)

    @property
    def processed(self) -> int:
        return sum(t.processed for t in self.turns)

    def history_misses(self) -> tuple[int, int]:
        """(later turns that prefilled more than their new messages, later turns).

        A turn's new tokens are its prompt's less the previous turn's (the reply and the new user
        message); an engine that still holds the previous turn prefills those and a few more, one
        that does not, the history too.
        """
        previous: dict[tuple[int, int], int] = {}
        misses = later = 0
        for t in sorted(self.turns, key=lambda t: (t.round, t.conversation, t.turn)):
            key = (t.round, t.conversation)
            if key in previous:
                later += 1
                # 32: the chat template's glue, and the reply's text, which re-tokenizes differently
                # from the tokens the engine generated and cached.
                if t.processed > t.prompt_tokens - previous[key] + 32:
                    misses += 1
            previous[key] = t.prompt_tokens
        return misses, later


async def _one(
    session: aiohttp.ClientSession, url: str, body: dict[str, Any], result: _Result, c: int, turn: int
) -> str:
    """Send one streamed turn; the reply's text."""
    start = time.perf_counter()
    first: float | None = None
    text: list[str] = []
    prompt_tokens = processed = 0
    prefill_ms = 0.0
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
                prompt_tokens = usage["prompt_tokens"]
                result.completion_tokens += usage["completion_tokens"]
            if timings := chunk.get("timings"):
                processed = timings.get("prompt_n", 0)
                prefill_ms = timings.get("prompt_ms", 0.0)
    ttft = (first if first is not None else time.perf_counter()) - start
    result.turns.append(_Turn(c, turn, ttft, prompt_tokens, processed, prefill_ms))
    return "".join(text)


async def _workload(url: str, tag: str, args: argparse.Namespace, send_user: bool) -> _Result:
    rng = random.Random(tag)
    # Apart from the words: which conversation speaks next is the users' doing, not the text's.
    order = random.Random(f"{tag}-order")
    work: _Workload = args.work
    system = work.system(f"seed {args.seed}")
    histories: list[list[dict[str, str]]] = [
        [{"role": "system", "content": system}] for _ in range(args.conversations)
    ]
    turns_left = [args.turns] * args.conversations
    ready: list[int] = list(range(args.conversations))
    result = _Result()
    tasks: set[asyncio.Task[None]] = set()
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as session:

        async def turn(c: int) -> None:
            number = args.turns - turns_left[c]
            histories[c].append({"role": "user", "content": work.user(rng, c, number)})
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
            text = await _one(session, url, body, result, c, number)
            histories[c].append({"role": "assistant", "content": text})
            turns_left[c] -= 1
            if turns_left[c]:
                ready.append(c)

        start = time.perf_counter()
        tick = 0
        while any(turns_left) or tasks:
            if ready:
                # A ready conversation at random, not in turn: conversations taken in a fixed rotation
                # reach a round-robin router in the same order each time, and an even number of them
                # then lands every turn of a conversation on the same replica, by accident.
                task = asyncio.create_task(turn(ready.pop(order.randrange(len(ready)))))
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


async def _warm(endpoints: list[str], args: argparse.Namespace) -> None:
    """Give every slot of every replica the deployment's system prompt, as a replica serving it has.

    Without it, each policy's first conversations would pay the system prompt once per slot, and
    whichever policy ran first would pay it for the others.
    """
    system = args.work.system(f"seed {args.seed}")
    async with aiohttp.ClientSession() as session:
        for endpoint in endpoints:
            # One at a time: each request then takes the least recently used slot, a fresh one.
            for i in range(args.engine_slots):
                body = {
                    "model": MODEL,
                    "messages": [
                        {"role": "system", "content": system},
                        {"role": "user", "content": f"hi {i}"},
                    ],
                    "max_tokens": 1,
                }
                async with session.post(endpoint + "/v1/chat/completions", json=body) as reply:
                    reply.raise_for_status()


def _watch(router: Router, endpoints: list[str], counts: _Result) -> None:
    """Count, on router, the requests the prefix index could place by their history, and those moved."""
    route = router.route

    def watched(
        model: str, session: str = "", blocks: Sequence[int] = (), tried: Collection[str] = ()
    ) -> tuple[str, str]:
        matched = router.prefixes.matched(blocks)
        # Idle replicas and a factor of 1: the replica that served the longest remembered prefix.
        wanted = router.prefixes.choose(blocks[:matched], endpoints, {}, 1.0) if matched > 1 else None
        served, endpoint = route(model, session, blocks, tried)
        if wanted is not None:
            counts.remembered += 1
            counts.moved += endpoint != wanted
        return served, endpoint

    router.route = watched  # type: ignore[method-assign]


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
                await stack.enter_async_context(_llama_server(build, model, work / f"engine-{i}.log", args))
                for i in range(2)
            ]
            await _warm(endpoints, args)
            for round_ in range(args.rounds):
                for policy in args.policies:
                    cfg = ServerConfig(
                        models=[ModelConfig(name=MODEL)],
                        auth=AuthConfig(enabled=False),
                        router=config.evolve(RouterConfig(), policy=policy),
                    )
                    app = make_gateway_app(cfg, Catalog(cfg), _Replicas(endpoints), KeyCache())
                    counts = _Result()
                    _watch(app[ROUTER_KEY], endpoints, counts)
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
                    # Each round's conversations are their own: turn numbers stay apart by round.
                    total.turns += [attrs.evolve(t, round=round_) for t in got.turns]
                    total.completion_tokens += got.completion_tokens
                    total.errors += got.errors
                    total.skipped_ticks += got.skipped_ticks
                    total.seconds += got.seconds
                    total.remembered += counts.remembered
                    total.moved += counts.moved
                    print(
                        f"  {policy} round {round_ + 1}: {len(got.turns)} requests, {got.errors} errors, "
                        f"{got.processed:,} of {got.prompt_tokens:,} prompt tokens processed, "
                        f"TTFT p50 {_quantile(got.ttft, 0.5) * 1000:.0f} ms",
                        flush=True,
                    )
    return results


def _decision(blocks_capacity: int) -> None:
    """CPU time of one routing decision per policy, and the prefix index's memory per block."""
    catalog = Catalog(ServerConfig(models=[ModelConfig(name=MODEL)]))
    endpoints = ["http://127.0.0.1:1", "http://127.0.0.1:2"]
    rng = random.Random(1)
    work = WORKLOADS["support"]
    system = work.system("decision")
    payloads = []
    for c in range(64):
        messages = [{"role": "system", "content": system}]
        for t in range(rng.randint(1, 5)):
            messages += [
                {"role": "user", "content": work.user(rng, c, t)},
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


def _report(results: dict[str, _Result]) -> None:
    print(
        f"\n{'policy':16} {'TTFT p50':>9} {'TTFT p95':>9} {'prefill':>8} {'rest':>7} {'req/s':>6} "
        f"{'tok/s':>6} {'processed/prompt tokens':>27} {'history misses':>15} {'errors':>6}"
    )
    for policy, r in results.items():
        share = r.processed / r.prompt_tokens if r.prompt_tokens else 0.0
        misses, later = r.history_misses()
        prefill = _quantile([t.prefill_ms for t in r.turns], 0.5)
        rest = _quantile([t.ttft * 1000 - t.prefill_ms for t in r.turns], 0.5)
        print(
            f"{policy:16} {_quantile(r.ttft, 0.5) * 1000:7.0f}ms {_quantile(r.ttft, 0.95) * 1000:7.0f}ms "
            f"{prefill:6.0f}ms {rest:5.0f}ms {len(r.turns) / r.seconds:6.2f} "
            f"{r.completion_tokens / r.seconds:6.1f} {r.processed:>10,}/{r.prompt_tokens:<10,} {share:4.0%} "
            f"{misses:>6} of {later:<5} {r.errors:>6}"
        )
        if r.remembered:
            print(
                f"  {policy}: {r.moved} of {r.remembered} requests with a remembered history "
                "moved by the load bound"
            )
    if results:
        print(
            "\nprefill and rest: medians of the engine's prefill time (timings.prompt_ms) and of the time to "
            "first token less it (the wait for a slot, the gateway, the first token)"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--workload", choices=sorted(WORKLOADS), default="coding", help="(default coding)")
    parser.add_argument("--rate", type=float, help="requests per second (default: the workload's)")
    parser.add_argument(
        "--conversations", type=int, help="conversations per policy (default: the workload's)"
    )
    parser.add_argument("--turns", type=int, help="user turns per conversation (default: the workload's)")
    parser.add_argument("--max-tokens", type=int, default=16, help="completion tokens per turn")
    parser.add_argument("--rounds", type=int, default=2, help="times each policy runs, in turn (default 2)")
    parser.add_argument(
        "--policies",
        default=",".join(POLICIES),
        help=f"comma-separated, run in this order (default {','.join(POLICIES)})",
    )
    parser.add_argument("--engine-threads", type=int, default=1, help="llama-server --threads")
    parser.add_argument("--engine-slots", type=int, help="llama-server -np (default: the workload's)")
    parser.add_argument("--slot-context", type=int, help="context tokens per slot (default: the workload's)")
    parser.add_argument(
        "--engine-arg", action="append", default=[], help="one more llama-server argument (repeatable)"
    )
    parser.add_argument("--seed", type=int, default=0, help="varies the words of every prompt")
    parser.add_argument("--decision", action="store_true", help="also time the router's decision")
    parser.add_argument("--no-engines", action="store_true", help="only the decision and the index")
    parser.add_argument("--index-entries", type=int, default=RouterConfig().prefix_index_entries)
    args = parser.parse_args(argv)
    work = args.work = WORKLOADS[args.workload]
    args.rate = args.rate or work.rate
    args.conversations = args.conversations or work.conversations
    args.turns = args.turns or work.turns
    args.engine_slots = args.engine_slots or work.slots
    args.slot_context = args.slot_context or work.slot_context
    args.policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    unknown = [p for p in args.policies if p not in POLICIES]
    if unknown:
        parser.error(f"unknown policy {', '.join(unknown)}: the policies are {', '.join(POLICIES)}")
    if not args.no_engines:
        print(
            f"{args.workload} ({work.summary}): {args.conversations} conversations x {args.turns} turns per "
            f"policy, {args.rate} requests/s, {args.rounds} round(s), two llama-server replicas of "
            f"{args.engine_slots} slots x {args.slot_context} tokens {' '.join(args.engine_arg)}",
            flush=True,
        )
        # SIGTERM as Ctrl-C: the run unwinds and stops its llama-server replicas.
        signal.signal(signal.SIGTERM, signal.default_int_handler)
        _report(asyncio.run(_engines(args)))
    if args.decision or args.no_engines:
        _decision(args.index_entries)
    return 0


if __name__ == "__main__":
    sys.exit(main())
