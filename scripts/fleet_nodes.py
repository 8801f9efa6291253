"""How many nodes one control plane holds: simulated nodes on loopback (bench_fleet.py --nodes N).

The server and one real agent, which runs the sim replica the chat requests
reach, are `llmgw` processes; the N simulated nodes are another process
(`--simulate`), each node with its own certificate, TLS connection and stream,
registering as an agent does (GPUs, memory, engines, fabrics, disks, weights)
and heartbeating at the agents' interval, jittered as agents jitter it. Nothing
here needs root or network namespaces. A measurement, not a test.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import json
import os
import resource
import secrets
import shutil
import signal
import socket
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import aiohttp
import psutil
from grpclib.client import Channel
from grpclib.const import Cardinality
from grpclib.encoding.base import CodecBase
from ruamel.yaml import YAML

from llmgw import pki
from llmgw.agent.client import beat_gap
from llmgw.agent.state import read_state, still_running
from llmgw.config import AgentConfig, TLSConfig
from llmgw.control.stream.service import CONNECT
from llmgw.proto.llmgw import v1 as pb

CHAT = {"model": "sim-chat", "messages": [{"role": "user", "content": "Say hello"}], "max_tokens": 8}
ZERO_DELAY = ["--ttft-ms", "0", "--tokens-per-s", "0"]
# Handshakes under way at once: a real fleet's agents do not all dial in the same millisecond either.
DIALS_AT_ONCE = 64


def _open_files(count: int) -> None:
    """Raise this process's open-file limit to count (root may go past the hard limit)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = max(soft, count)
    with contextlib.suppress(ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, max(hard, want)))


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _yaml(path: Path, data: dict[str, Any]) -> Path:
    with path.open("w") as f:
        YAML().dump(data, f)
    return path


def _llmgw(*args: str) -> list[str]:
    return [sys.executable, "-m", "llmgw", *args]


# --- the simulated nodes ---------------------------------------------------------------------


class _Raw(CodecBase):
    """Messages as bytes both ways: the load generator must not spend its CPU on betterproto."""

    __content_subtype__ = "proto"

    def encode(self, message: Any, message_type: Any) -> bytes:
        return bytes(message)

    def decode(self, data: bytes, message_type: Any) -> Any:
        return data


def _varint(value: int) -> bytes:
    out = bytearray()
    value &= (1 << 64) - 1
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _heartbeat(sequence: int, total_mb: int, available_mb: int) -> bytes:
    """AgentMessage{heartbeat: Heartbeat{sequence, memory}} encoded by hand, as an idle agent sends it."""
    memory = b"\x08" + _varint(total_mb) + b"\x10" + _varint(available_mb)
    beat = b"\x08" + _varint(sequence) + b"\x12" + _varint(len(memory)) + memory
    return b"\x12" + _varint(len(beat)) + beat


def _register(node_id: str, index: int, interval_s: float) -> bytes:
    """A Register as a GPU node's agent sends it: 8 GPUs, engines, a fabric, disks, weights.

    Two encoded Registers one after the other read as one with both's fields: the part every
    node shares is encoded once, so the load generator does not spend its CPU on betterproto.
    """
    own = pb.Register(
        node_id=node_id,
        labels={"zone": ("eu", "us")[index % 2], "rack": f"r{index // 40}"},
        fabrics=[pb.Fabric(name=f"ib-{index // 64}", hcas=["mlx5_0", "mlx5_1"])],
    )
    register = _shared_register(interval_s) + bytes(own)
    return b"\x0a" + _varint(len(register)) + register


@functools.cache
def _shared_register(interval_s: float) -> bytes:
    gpus = [
        pb.Gpu(
            index=g,
            uuid=f"GPU-{g:08d}",
            name="NVIDIA H100 80GB HBM3",
            gpu_class="h100-80g",
            memory_total_mb=81559,
            memory_used_mb=0,
            healthy=True,
        )
        for g in range(8)
    ]
    weights = [
        pb.Weights(
            source=f"hf://org/model-{w}",
            path=f"/var/lib/llmgw-agent/weights/model-{w}",
            size_bytes=(w + 1) * 4_000_000_000,
            sha256=hashlib.sha256(f"{w}".encode()).hexdigest(),
        )
        for w in range(3)
    ]
    register = pb.Register(
        agent_version="0.1.0",
        gpus=gpus,
        memory=pb.Memory(total_mb=2_000_000, available_mb=1_800_000),
        # Engines this benchmark's model cannot use: its sim replica stays on the real agent's node.
        engine_versions={"llamacpp": "b6500", "vllm": "0.11.0"},
        engines_probed=True,
        heartbeat_interval_ms=int(interval_s * 1000),
        storage=[pb.Storage(path="/var/lib/llmgw-agent", total_bytes=4 << 40, free_bytes=3 << 40)],
        host=pb.Host(
            os_id="ubuntu",
            os_version="24.04",
            os_codename="noble",
            arch="amd64",
            cpu_flags=["avx2", "avx512f"],
            nvidia_driver="570.86.15",
            family="deb",
            id_like=["debian"],
        ),
        weights=weights,
        advertise_address="127.0.0.1",
    )
    return bytes(register)


def _client_context(tls: TLSConfig) -> ssl.SSLContext:
    """An agent's TLS (pki.client_ssl_context) without the system's authorities, which only it trusts.

    Loading those costs about 90 ms and hundreds of KiB per context: one agent pays it once,
    a process simulating thousands of them would spend its registrations there.
    """
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_verify_locations(cafile=tls.ca)
    ctx.load_cert_chain(tls.cert, tls.key)
    ctx.set_alpn_protocols(["h2"])
    return ctx


class _Counts:
    def __init__(self) -> None:
        self.registered = 0
        self.failed: dict[str, int] = {}
        self.all_registered = asyncio.Event()


async def _node(
    node_id: str,
    index: int,
    port: int,
    tls: TLSConfig,
    interval_s: float,
    dials: asyncio.Semaphore,
    counts: _Counts,
    total: int,
) -> None:
    channel: Channel | None = None
    try:
        async with dials:
            # Made here, not before the turn to dial: thousands of nodes each loading their
            # certificate first held up the handshakes already under way past the server's 60 s.
            channel = Channel("127.0.0.1", port, ssl=_client_context(tls), codec=_Raw())
            stream = channel.request(CONNECT, Cardinality.STREAM_STREAM, bytes, bytes)  # type: ignore[arg-type]
            await stream.__aenter__()
            await stream.send_message(_register(node_id, index, interval_s))
            if await stream.recv_message() is None:
                raise ConnectionError("the stream ended before its Ack")
        counts.registered += 1
        if counts.registered == total:
            counts.all_registered.set()

        async def drain() -> None:
            while await stream.recv_message() is not None:
                pass

        reader = asyncio.create_task(drain())
        sequence = 0
        try:
            while True:
                await asyncio.sleep(beat_gap(interval_s))
                sequence += 1
                # Available memory moves a little, as a live node's does.
                await stream.send_message(_heartbeat(sequence, 2_000_000, 1_800_000 - (sequence % 7) * 1024))
        finally:
            reader.cancel()
            await asyncio.gather(reader, return_exceptions=True)
    # A node that fails is counted and named, not fatal to the run.
    except Exception as exc:
        reason = type(exc).__name__
        counts.failed[reason] = counts.failed.get(reason, 0) + 1
        print(json.dumps({"failed": node_id, "error": f"{reason}: {exc}"}), file=sys.stderr, flush=True)
    finally:
        if channel is not None:
            channel.close()


async def _simulate(count: int, port: int, pki_dir: Path, interval_s: float) -> None:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    certs = pki_dir / "nodes"
    certs.mkdir(exist_ok=True)
    ids = [f"sim-{i:05d}" for i in range(count)]
    for node_id in ids:
        if not (certs / f"{node_id}.pem").exists():
            pki.issue_agent(pki_dir, node_id, certs)
    print(json.dumps({"certificates": count}), flush=True)
    counts = _Counts()
    dials = asyncio.Semaphore(DIALS_AT_ONCE)
    started = time.monotonic()
    ca = str(pki_dir / "ca.pem")
    tasks = [
        asyncio.create_task(
            _node(
                node_id,
                i,
                port,
                TLSConfig(ca, str(certs / f"{node_id}.pem"), str(certs / f"{node_id}-key.pem")),
                interval_s,
                dials,
                counts,
                count,
            )
        )
        for i, node_id in enumerate(ids)
    ]
    registered = asyncio.create_task(counts.all_registered.wait())
    stopped = asyncio.create_task(stop.wait())
    await asyncio.wait([registered, stopped], return_when=asyncio.FIRST_COMPLETED)
    print(
        json.dumps(
            {
                "registered": counts.registered,
                "registered_s": time.monotonic() - started,
                "failed": counts.failed,
            }
        ),
        flush=True,
    )
    await stop.wait()
    for task in (*tasks, registered):
        task.cancel()
    await asyncio.gather(*tasks, registered, stopped, return_exceptions=True)
    print(json.dumps({"failed": counts.failed}), flush=True)


def simulate(argv: Sequence[str]) -> None:
    """The load generator's own process: `fleet_nodes.py COUNT PORT PKI_DIR INTERVAL_S NICE`."""
    count, port, pki_dir, interval_s = int(argv[0]), int(argv[1]), Path(argv[2]), float(argv[3])
    # Nodes are other machines: here they share the server's cores, and at 10,000 of them take
    # most of one. At a lower priority they take what the server, its engine and the chat client
    # leave, as they would on machines of their own, instead of the cores those wait for.
    os.nice(int(argv[4]))
    _open_files(count + 1000)
    asyncio.run(_simulate(count, port, pki_dir, interval_s))


# --- the measurement ------------------------------------------------------------------------


async def _chat_trickle(url: str, key: str, seconds: float, rps: float, phase: str) -> list[float]:
    """Latencies (ms) of one small chat request every 1/rps seconds for seconds, each on its own.

    Each request's x-request-id starts with phase, so the server's request log says what the
    gateway itself took for the same requests (_served).
    """
    latencies: list[float] = []
    # No cap on connections (aiohttp's default is 100): a slow phase must not queue its requests
    # in this client, where the wait would be counted against the gateway.
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60), connector=connector) as session:

        async def one(n: int) -> None:
            headers = {"Authorization": f"Bearer {key}", "x-request-id": f"{phase}-{n}"}
            sent = time.perf_counter()
            async with session.post(f"{url}/v1/chat/completions", json=CHAT, headers=headers) as reply:
                await reply.read()
                if reply.status == 200:
                    latencies.append((time.perf_counter() - sent) * 1000)

        tasks = []
        start = time.monotonic()
        sent = 0
        while time.monotonic() - start < seconds:
            tasks.append(asyncio.create_task(one(sent)))
            sent += 1
            await asyncio.sleep(max(0.0, start + sent / rps - time.monotonic()))
        await asyncio.gather(*tasks, return_exceptions=True)
    return latencies


def _served(log: Path, phase: str) -> list[float]:
    """The gateway's own latency (ms, from its request log) of phase's requests that succeeded."""
    latencies = []
    with log.open() as lines:
        for line in lines:
            if f'"{phase}-' not in line:
                continue
            with contextlib.suppress(ValueError):
                entry = json.loads(line)
                if entry.get("event") == "request" and entry.get("status") == 200:
                    latencies.append(float(entry["latency_ms"]))
    return latencies


def _p(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1] if len(values) > 1 else values[0]


def _wait(what: str, ok: Any, timeout_s: float, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + timeout_s
    while not ok():
        if proc.poll() is not None:
            raise SystemExit(f"bench_fleet: the server exited while waiting for {what}")
        if time.monotonic() > deadline:
            raise SystemExit(f"bench_fleet: no {what} within {timeout_s:g} s")
        time.sleep(0.2)


def _answers(url: str, key: str) -> bool:
    async def one() -> bool:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as session:
            try:
                async with session.post(
                    f"{url}/v1/chat/completions", json=CHAT, headers={"Authorization": f"Bearer {key}"}
                ) as reply:
                    return reply.status == 200
            except (aiohttp.ClientError, TimeoutError):
                return False

    return asyncio.run(one())


def _waited_s(pid: int) -> float:
    """How long pid's main thread (the server's event loop) has waited, ready to run, for a CPU.

    When the machine is busier than its cores, a request's latency is mostly
    this wait: the loop had work but no core to run it on. Linux counts it
    per thread in schedstat (its second figure, in nanoseconds); 0 where it
    does not.
    """
    try:
        return int(Path(f"/proc/{pid}/task/{pid}/schedstat").read_text().split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return 0.0


def _cpu_s(proc: psutil.Process) -> float:
    times = proc.cpu_times()
    return float(times.user + times.system)


def measure(
    nodes: int,
    seconds: float,
    heartbeat_s: float | None,
    rps: float,
    keep_logs: Path | None = None,
    fleet_nice: int = 19,
) -> dict[str, Any]:
    interval = heartbeat_s if heartbeat_s is not None else AgentConfig().heartbeat_interval_s
    _open_files(nodes + 1000)
    with tempfile.TemporaryDirectory(prefix="bench-nodes-") as tmp:
        root = Path(tmp)
        ca = root / "pki"
        pki.init_ca(ca)
        pki.issue_server(ca, "server", ["127.0.0.1", "localhost"], ca)
        pki.issue_agent(ca, "sim-host", ca)
        gateway_port, agent_port = _free_port(), _free_port()
        token = secrets.token_urlsafe(24)
        server_yaml = _yaml(
            root / "server.yaml",
            {
                "listen": f"127.0.0.1:{gateway_port}",
                "agent_listen": f"127.0.0.1:{agent_port}",
                # Not the default 9090: another server on the machine may hold it.
                "admin_listen": f"127.0.0.1:{_free_port()}",
                "state_dir": str(root / "server"),
                "admin_tokens": [hashlib.sha256(token.encode()).hexdigest()],
                "tls": {
                    "ca": str(ca / "ca.pem"),
                    "cert": str(ca / "server.pem"),
                    "key": str(ca / "server-key.pem"),
                },
                "engines": {"llamacpp": ""},
                # The gateway's own latency of each chat request, read back by _served.
                "log": {"requests": True},
                "models": [
                    {"name": "sim-chat", "replicas": 1, "profiles": [{"engine": "sim", "args": ZERO_DELAY}]}
                ],
            },
        )
        agent_yaml = _yaml(
            root / "agent.yaml",
            {
                "node_id": "sim-host",
                "servers": [f"127.0.0.1:{agent_port}"],
                "state_dir": str(root / "agent"),
                "heartbeat_interval_s": interval,
                "tls": {
                    "ca": str(ca / "ca.pem"),
                    "cert": str(ca / "sim-host.pem"),
                    "key": str(ca / "sim-host-key.pem"),
                },
                "engines": {"disabled": ["llamacpp", "vllm", "sglang"]},
            },
        )
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        key = subprocess.run(
            _llmgw("keys", "create", "bench", "--config", str(server_yaml)),
            capture_output=True,
            text=True,
            check=True,
            env=env,
        ).stdout.strip()
        url = f"http://127.0.0.1:{gateway_port}"
        logs = root / "logs"
        logs.mkdir()
        procs: list[subprocess.Popen[bytes]] = []
        try:
            with (logs / "server.log").open("wb") as out:
                server = subprocess.Popen(
                    _llmgw("--log-format=json", "--role=server", "--config", str(server_yaml)),
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    env=env,
                )
            procs.append(server)
            with (logs / "agent.log").open("wb") as out:
                procs.append(
                    subprocess.Popen(
                        _llmgw("--log-format=json", "--role=agent", "--config", str(agent_yaml)),
                        stdout=out,
                        stderr=subprocess.STDOUT,
                        env=env,
                    )
                )
            _wait("sim replica answering through the gateway", lambda: _answers(url, key), 120, server)
            watched = psutil.Process(server.pid)
            cpu0, waited0, t0 = _cpu_s(watched), _waited_s(server.pid), time.monotonic()
            idle = asyncio.run(_chat_trickle(url, key, seconds, rps, "idle"))
            idle_cpu = (_cpu_s(watched) - cpu0) / (time.monotonic() - t0) * 100
            idle_waited = (_waited_s(server.pid) - waited0) / (time.monotonic() - t0) * 100
            idle_rss = watched.memory_info().rss
            sim = subprocess.Popen(
                [sys.executable, __file__, *map(str, (nodes, agent_port, ca, interval, fleet_nice))],
                stdout=subprocess.PIPE,
                env=env,
            )
            procs.append(sim)
            assert sim.stdout is not None
            json.loads(sim.stdout.readline())  # certificates issued
            registered = json.loads(sim.stdout.readline())
            # One interval for the registrations' garbage to settle, then the steady part.
            time.sleep(interval)
            cpu0, waited0, t0 = _cpu_s(watched), _waited_s(server.pid), time.monotonic()
            steady = asyncio.run(_chat_trickle(url, key, seconds, rps, "steady"))
            cpu = (_cpu_s(watched) - cpu0) / (time.monotonic() - t0) * 100
            waited = (_waited_s(server.pid) - waited0) / (time.monotonic() - t0) * 100
            rss = watched.memory_info().rss
            load = os.getloadavg()[0]
            sim.send_signal(signal.SIGTERM)
            ended = json.loads(sim.stdout.readline() or "{}")
        finally:
            for proc in reversed(procs):
                proc.terminate()
            for proc in reversed(procs):
                try:
                    proc.wait(30)
                except subprocess.TimeoutExpired:
                    proc.kill()
            # Engines outlive their agent on purpose (the next agent adopts them): the sim replica
            # is stopped here, or every run would leave one behind.
            for record in read_state(root / "agent"):
                if still_running(record):
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(record.pid, signal.SIGTERM)
            if keep_logs is not None:
                shutil.copytree(logs, keep_logs, dirs_exist_ok=True)
        idle_served = _served(logs / "server.log", "idle")
        steady_served = _served(logs / "server.log", "steady")
    return {
        "nodes": nodes,
        "heartbeat_s": interval,
        "registered_s": round(registered["registered_s"], 1),
        "registered": registered["registered"],
        "failed": ended.get("failed", registered["failed"]),
        "server_cpu_pct": round(cpu, 1),
        "idle_server_cpu_pct": round(idle_cpu, 1),
        "server_rss_mb": round(rss / 2**20),
        "rss_per_node_kb": round((rss - idle_rss) / 1024 / max(nodes, 1), 1),
        "cpu_pct_per_1000_nodes": round((cpu - idle_cpu) / max(nodes, 1) * 1000, 2),
        "chat_p50_ms": round(_p(steady, 50), 1),
        "chat_p99_ms": round(_p(steady, 99), 1),
        "idle_chat_p99_ms": round(_p(idle, 99), 1),
        "chats": len(steady),
        # The same requests as the gateway saw them (its request log): what the client's figures
        # add beyond these is the client's own wait and the loopback hop.
        "served_p50_ms": round(_p(steady_served, 50), 1),
        "served_p99_ms": round(_p(steady_served, 99), 1),
        "idle_served_p99_ms": round(_p(idle_served, 99), 1),
        # The share of the steady part (and of the idle one) that the server's loop spent ready to
        # run but waiting for a core another process held.
        "server_loop_waited_pct": round(waited, 1),
        "idle_server_loop_waited_pct": round(idle_waited, 1),
        "load_avg_1m": round(load, 2),
        "fleet_nice": fleet_nice,
    }


if __name__ == "__main__":
    simulate(sys.argv[1:])
