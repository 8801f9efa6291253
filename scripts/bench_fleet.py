#!/usr/bin/env python3
"""What losing a node costs, and what a network hop adds: llmgw on hosts made of network namespaces.

Run as root (it makes network namespaces, with the fleet tests' own helpers in
tests/fleet/). Two measurements:

1. Failover. sim-chat has one replica, on n1 (`--replicas 2`: two, on n1
   and n2); one more node is connected and idle. A client on the control
   plane's host sends a steady 20 requests a second (`--rps`) while n1's link
   is cut. Reported: the time from the cut to n1 leaving the routing table,
   and to a replacement being ready on the idle node, and how many requests
   failed in between (by status).
2. The gateway's added p50 at concurrency 1, non-streamed: the gateway's p50
   minus the engine's own (asked directly, with its secret) when the engine is
   on another host (n1), and when it is on the control plane's own host,
   listening on loopback.

With `--nodes N` it measures something else, with no root needed: how many
nodes one control plane holds (scripts/fleet_nodes.py). N simulated nodes in a
process of their own connect, register and heartbeat, while a steady trickle
of chat requests goes through the gateway to a sim replica; one JSON line says
how long registration took, the server's CPU and memory over the steady part,
and the gateway's chat latency then and with no nodes connected, as the client
and as the gateway itself timed it, with how long the server's loop waited
for a core. The simulated nodes run at the lowest CPU priority (`--fleet-nice`):
on a real fleet they are other machines.

    bench_fleet.py --nodes 10000 [--seconds 30] [--heartbeat-s 5] [--fleet-nice 19] [--keep-logs DIR]

A measurement, not a test: nothing here asserts a time.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

import fleet_nodes
from fleet.cluster import Certificates, Fleet
from fleet.netns import Host, Network, remove_leftovers, unavailable, wait_until

from llmgw.agent.state import read_state

ZERO_DELAY = ["--ttft-ms", "0", "--tokens-per-s", "0"]
BODY = {"messages": [{"role": "user", "content": "Say hello"}], "max_tokens": 16}


def _in(host: Host, target: Any) -> threading.Thread:
    """A thread running target() inside host's namespace (its own, so Host.call stays free)."""
    thread = threading.Thread(target=lambda: host.call_here(target), daemon=True)
    thread.start()
    return thread


async def _steady(
    url: str, key: str, rps: float, stop: threading.Event, log: list[tuple[float, int]]
) -> None:
    """One request every 1/rps seconds, each on its own, until stop: (sent at, status) in log."""
    timeout = aiohttp.ClientTimeout(total=120)
    # No limit on connections: a request held up by the lost node must not hold up those after it.
    async with aiohttp.ClientSession(timeout=timeout, connector=aiohttp.TCPConnector(limit=0)) as session:

        async def one(sent: float) -> None:
            try:
                async with session.post(
                    f"{url}/v1/chat/completions",
                    json={"model": "sim-chat", **BODY},
                    headers={"Authorization": f"Bearer {key}"},
                ) as reply:
                    await reply.read()
                    log.append((sent, reply.status))
            except (aiohttp.ClientError, TimeoutError):
                log.append((sent, 0))

        tasks = []
        start = time.monotonic()
        sent = 0
        while not stop.is_set():
            tasks.append(asyncio.create_task(one(time.monotonic())))
            sent += 1
            await asyncio.sleep(max(0.0, start + sent / rps - time.monotonic()))
        await asyncio.gather(*tasks)


def failover(fleet: Fleet, rps: float, server: dict[str, Any], replicas: int) -> dict[str, Any]:
    model = {"name": "sim-chat", "replicas": replicas, "profiles": [{"engine": "sim", "args": ZERO_DELAY}]}
    serving = [f"n{i}" for i in range(1, replicas + 1)]
    idle = f"n{replicas + 1}"
    fleet.start_server([], **server)
    for name in serving:
        fleet.start_agent(fleet.network.hosts[name])
    fleet.wait_connected(*serving)
    fleet.add_model(model)
    fleet.wait_ready("sim-chat", replicas)
    fleet.start_agent(fleet.network.hosts[idle])
    fleet.wait_connected(idle)

    log: list[tuple[float, int]] = []
    stop = threading.Event()
    loader = _in(fleet.cp, lambda: asyncio.run(_steady(fleet.gateway, fleet.key, rps, stop, log)))
    time.sleep(3)
    cut = time.monotonic()
    fleet.network.hosts["n1"].cut_link()
    wait_until(lambda: not fleet.nodes()["n1"]["reachable"], 120, "n1 to leave", every_s=0.05)
    left = time.monotonic()
    wait_until(
        lambda: any(r["node"] == idle and r["state"] == "ready" for r in fleet.replicas("sim-chat")),
        120,
        f"a replacement on {idle}",
        every_s=0.05,
    )
    ready = time.monotonic()
    time.sleep(3)
    stop.set()
    loader.join()
    during = [status for sent, status in log if sent >= cut - 0.001]
    failed = Counter(s for s in during if s != 200)
    return {
        "left_s": left - cut,
        "ready_s": ready - cut,
        "sent": len(during),
        "failed": sum(failed.values()),
        "by_status": dict(failed),
        "grace_s": server["control"]["grace_s"],
        "idle": idle,
    }


async def _p50(url: str, model: str, auth: str, seconds: float) -> float:
    """p50 latency (ms) of sequential non-streamed requests on one keep-alive connection."""
    latencies = []
    async with aiohttp.ClientSession() as session:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            t = time.perf_counter()
            async with session.post(
                f"{url}/v1/chat/completions", json={"model": model, **BODY}, headers={"Authorization": auth}
            ) as reply:
                await reply.read()
                assert reply.status == 200, reply.status
            latencies.append(time.perf_counter() - t)
    return statistics.median(latencies[len(latencies) // 10 :]) * 1000


def added_latency(fleet: Fleet, seconds: float) -> dict[str, dict[str, float]]:
    hosts = fleet.network.hosts
    fleet.start_server([])
    fleet.start_agent(hosts["n1"], labels={"where": "far"})
    # The control plane's own host as a node whose engines listen on loopback.
    fleet.start_agent(hosts["cp"], advertise_address="127.0.0.1", labels={"where": "near"})
    fleet.wait_connected("n1", "cp")
    for name, where in (("sim-far", "far"), ("sim-near", "near")):
        profile = {"engine": "sim", "args": ZERO_DELAY, "labels": {"where": where}}
        fleet.add_model({"name": name, "replicas": 1, "profiles": [profile]})
    figures = {}
    for name, node in (("sim-far", "n1"), ("sim-near", "cp")):
        [replica] = fleet.wait_ready(name, 1)
        [record] = [r for r in read_state(fleet.workdir / node) if r.request.shard_id == replica["shard_id"]]
        secret = f"Bearer {record.request.engine_secret}"
        direct = fleet.cp.call(asyncio.run, _p50(replica["endpoint"], name, secret, seconds))
        gateway = fleet.cp.call(asyncio.run, _p50(fleet.gateway, name, f"Bearer {fleet.key}", seconds))
        figures[name] = {"endpoint": replica["endpoint"], "direct_ms": direct, "gateway_ms": gateway}
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rps", type=float, default=20.0, help="steady request rate during the cut")
    parser.add_argument("--grace-s", type=float, default=15.0, help="server.yaml control.grace_s")
    parser.add_argument("--interval-s", type=float, default=2.0, help="server.yaml control.interval_s")
    parser.add_argument("--replicas", type=int, choices=(1, 2), default=1, help="sim-chat's replicas")
    parser.add_argument(
        "--seconds", type=float, default=5.0, help="length of each latency cell (with --nodes: of each phase)"
    )
    parser.add_argument("--nodes", type=int, help="measure N simulated nodes instead (no root needed)")
    parser.add_argument(
        "--heartbeat-s", type=float, help="with --nodes: the nodes' heartbeat interval (the agents' default)"
    )
    parser.add_argument(
        "--fleet-nice",
        type=int,
        default=19,
        help="with --nodes: the simulated nodes' niceness, 0-19 (19: they take only the CPU left over)",
    )
    parser.add_argument(
        "--keep-logs",
        type=Path,
        help="with --nodes: copy the server's and the agent's logs to this directory",
    )
    args = parser.parse_args()
    if args.nodes is not None:
        if args.nodes < 0:
            sys.exit("bench_fleet: --nodes is a number of nodes, 0 or more")
        if args.heartbeat_s is not None and args.heartbeat_s <= 0:
            sys.exit("bench_fleet: --heartbeat-s must be more than 0")
        if not 0 <= args.fleet_nice <= 19:
            sys.exit("bench_fleet: --fleet-nice is a niceness from 0 (the server's) to 19 (the lowest)")
        print(
            json.dumps(
                fleet_nodes.measure(
                    args.nodes, args.seconds, args.heartbeat_s, args.rps, args.keep_logs, args.fleet_nice
                )
            )
        )
        return
    why = unavailable()
    if why:
        sys.exit(f"bench_fleet {why}")
    remove_leftovers()
    server = {"control": {"interval_s": args.interval_s, "grace_s": args.grace_s, "base_backoff_s": 5.0}}
    network = Network()
    try:
        for name, octet in (("cp", 1), ("n1", 11), ("n2", 12), ("n3", 13)):
            network.add_host(name, octet)
        with tempfile.TemporaryDirectory(prefix="bench-fleet-") as tmp:
            certificates = Certificates.create(Path(tmp) / "pki")
            fleet = Fleet(network, certificates, Path(tmp) / "failover")
            try:
                cut = failover(fleet, args.rps, server, args.replicas)
            finally:
                fleet.stop()
                network.hosts["n1"].restore_link()
            fleet = Fleet(network, certificates, Path(tmp) / "latency")
            try:
                latency = added_latency(fleet, args.seconds)
            finally:
                fleet.stop()
    finally:
        network.close()
    print(
        f"failover ({args.replicas} replicas, grace_s {cut['grace_s']:g}, "
        f"interval_s {args.interval_s:g}, {args.rps:g} requests/s): "
        f"n1 left the routing table {cut['left_s']:.1f} s after its link was cut; "
        f"a replacement was ready on {cut['idle']} after {cut['ready_s']:.1f} s; "
        f"{cut['failed']} of {cut['sent']} requests sent from the cut on failed {cut['by_status']}"
    )
    for name, f in latency.items():
        print(
            f"{name} at {f['endpoint']}: direct p50 {f['direct_ms']:.2f} ms, gateway p50 "
            f"{f['gateway_ms']:.2f} ms, added p50 {f['gateway_ms'] - f['direct_ms']:.2f} ms"
        )


if __name__ == "__main__":
    main()
