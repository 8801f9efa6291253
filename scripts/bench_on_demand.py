#!/usr/bin/env python3
"""Replicas that follow the load: a ramp of clients from 1 to 40 and back, on a model with
`scale: {min: 1, max: 3}` against the same ramp on a fixed 1 and a fixed 3.

Runs the server and agent roles in this process (real certificates, the agent starting real sim
engine processes), the sim started with `--slots 4 --ttft-ms 50 --tokens-per-s 100`: a replica
serves four requests at once and queues the rest, as an engine past its batch does, so that a
replica's capacity is its own and more replicas serve more. Each client sends a streamed chat
completion (16 tokens) as soon as its last one ended; the number of clients goes from 1 up to
--peak over the first half of --seconds and back to 1 over the second. Prints, per run: time to
first token p50/p95 over the whole ramp and per quarter of it, and the ready replicas every
--sample seconds. A measurement, not a test: nothing here asserts a time.

    python scripts/bench_on_demand.py [--seconds 150] [--peak 40] [--target 4] [--window 10]
        [--runs scale,fixed1,fixed3]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
import attrs

from llmgw import pki
from llmgw.config import (
    AgentConfig,
    AuthConfig,
    ControlConfig,
    ModelConfig,
    ProfileConfig,
    ScaleConfig,
    ServerConfig,
    TLSConfig,
)
from llmgw.roles.agent import agent_role
from llmgw.roles.server import server_role

MODEL = "ramp-chat"
SIM_ARGS = ["--slots", "4", "--ttft-ms", "50", "--tokens-per-s", "100"]


@attrs.define
class Sample:
    at: float
    ttft_s: float


def _model(run: str, target: float, window: float, seconds: float) -> ModelConfig:
    profile = ProfileConfig(engine="sim", args=SIM_ARGS)
    if run == "scale":
        scale = ScaleConfig(min=1, max=3, idle_s=seconds * 10, target_in_flight=target, window_s=window)
        return ModelConfig(name=MODEL, profiles=[profile], scale=scale)
    return ModelConfig(name=MODEL, profiles=[profile], replicas=int(run.removeprefix("fixed")))


def _configs(root: Path, model: ModelConfig) -> tuple[ServerConfig, Path]:
    pki_dir = root / "pki"
    pki.init_ca(pki_dir)
    pki.issue_server(pki_dir, "server", ["127.0.0.1"], pki_dir)
    pki.issue_agent(pki_dir, "node-1", pki_dir)
    server = ServerConfig(
        listen="127.0.0.1:0",
        admin_listen="127.0.0.1:0",
        agent_listen="127.0.0.1:0",
        state_dir=str(root / "server"),
        tls=TLSConfig(
            ca=str(pki_dir / "ca.pem"), cert=str(pki_dir / "server.pem"), key=str(pki_dir / "server-key.pem")
        ),
        auth=AuthConfig(enabled=False),
        control=ControlConfig(interval_s=1.0),
        models=[model],
        engines={"llamacpp": ""},
    )
    return server, pki_dir


def _agent(root: Path, pki_dir: Path, port: int) -> AgentConfig:
    return AgentConfig(
        node_id="node-1",
        servers=[f"127.0.0.1:{port}"],
        heartbeat_interval_s=0.5,
        state_dir=str(root / "agent"),
        keep_engines_on_stop=False,
        tls=TLSConfig(
            ca=str(pki_dir / "ca.pem"), cert=str(pki_dir / "node-1.pem"), key=str(pki_dir / "node-1-key.pem")
        ),
    )


async def _client(session: aiohttp.ClientSession, url: str, stop: asyncio.Event, out: list[Sample]) -> None:
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "tell me about the sea"}],
        "max_tokens": 16,
        "stream": True,
    }
    while not stop.is_set():
        began = time.perf_counter()
        first = 0.0
        async with session.post(f"{url}/v1/chat/completions", json=body) as reply:
            async for _ in reply.content.iter_any():
                first = first or time.perf_counter() - began
        if reply.status == 200:
            out.append(Sample(began, first))


def _clients_at(elapsed: float, seconds: float, peak: int) -> int:
    half = seconds / 2
    share = elapsed / half if elapsed < half else (seconds - elapsed) / half
    return max(1, round(1 + (peak - 1) * max(0.0, min(1.0, share))))


async def _ramp(
    url: str, ready: object, args: argparse.Namespace
) -> tuple[list[Sample], list[tuple[int, int, int]]]:
    """Run the ramp; the samples and (second, clients, ready replicas) every args.sample seconds."""
    samples: list[Sample] = []
    counts: list[tuple[int, int, int]] = []
    clients: list[tuple[asyncio.Event, asyncio.Task[None]]] = []
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:
        start = time.perf_counter()
        next_sample = 0.0
        while (elapsed := time.perf_counter() - start) < args.seconds:
            want = _clients_at(elapsed, args.seconds, args.peak)
            while len(clients) < want:
                stop = asyncio.Event()
                clients.append((stop, asyncio.create_task(_client(session, url, stop, samples))))
            while len(clients) > want:
                clients.pop()[0].set()
            if elapsed >= next_sample:
                counts.append((round(elapsed), want, len(ready(MODEL))))  # type: ignore[operator]
                next_sample += args.sample
            await asyncio.sleep(0.25)
        for stop, _ in clients:
            stop.set()
        await asyncio.gather(*(task for _, task in clients), return_exceptions=True)
    for sample in samples:
        sample.at -= start
    return samples, counts


def _percentiles(values: list[float]) -> str:
    if len(values) < 2:
        return "n/a"
    cuts = statistics.quantiles(values, n=20)
    p50, p95 = statistics.median(values) * 1000, cuts[18] * 1000
    return f"p50 {p50:.0f} ms, p95 {p95:.0f} ms ({len(values)} requests)"


async def _one(run: str, args: argparse.Namespace) -> None:
    model = _model(run, args.target, args.window, args.seconds)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        cfg, pki_dir = await asyncio.to_thread(_configs, root, model)
        async with contextlib.AsyncExitStack() as stack:
            server = await stack.enter_async_context(server_role(cfg))
            await stack.enter_async_context(agent_role(_agent(root, pki_dir, server.agent_port)))
            wanted = 3 if run == "fixed3" else 1
            # Polling what another process's progress decides: the engines becoming ready.
            while len(server.inventory.ready_endpoints(MODEL)) < wanted:  # noqa: ASYNC110
                await asyncio.sleep(0.2)
            samples, counts = await _ramp(server.gateway_url, server.inventory.ready_endpoints, args)
    print(f"\n== {run} ==")
    print(f"whole ramp: TTFT {_percentiles([s.ttft_s for s in samples])}")
    quarter = args.seconds / 4
    for q in range(4):
        part = [s.ttft_s for s in samples if q * quarter <= s.at < (q + 1) * quarter]
        print(f"  quarter {q + 1} ({q * quarter:.0f}-{(q + 1) * quarter:.0f} s): TTFT {_percentiles(part)}")
    print("  second clients replicas: " + ", ".join(f"{s}s:{c}/{r}" for s, c, r in counts))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seconds", type=float, default=150.0)
    parser.add_argument("--peak", type=int, default=40)
    parser.add_argument("--target", type=float, default=4.0)
    parser.add_argument("--window", type=float, default=10.0)
    parser.add_argument("--sample", type=float, default=10.0)
    parser.add_argument("--runs", default="scale,fixed1,fixed3")
    args = parser.parse_args()
    for run in args.runs.split(","):
        asyncio.run(_one(run, args))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
