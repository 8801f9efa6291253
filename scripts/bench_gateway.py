#!/usr/bin/env python3
"""What the gateway adds: requests straight to a sim engine, then through llmgw.

Starts `llmgw --role=server --role=agent --dev` in its own directory with the
sim engine at zero delay, finds the engine's own port, and drives both with a
load generator running in this process (llmgw and the engine run in theirs).
Prints requests per second, p50 and p99 for concurrency 1 and 64, streamed and
not, and the ratios, for each API asked for (`--route chat messages responses`:
the same short prompt and 16 tokens to /v1/chat/completions, /v1/messages or
/v1/responses, which the sim speaks natively). `--rounds N` measures every
cell N times, round after round, so that a change in the machine's other load
falls on all of them. `--litellm PROGRAM` (LiteLLM's `litellm` command, from a
virtual environment of its own) also starts LiteLLM's proxy on loopback in
front of the same engine, as an OpenAI-compatible upstream, and measures it
in each cell right after the gateway. `--rev REV` (a git revision, or a wheel
of an earlier release) also starts llmgw as it was there, from a virtual
environment built once in ~/.cache/llmgw/bench, beside this tree's, measures
both in every cell in alternating order, and prints this tree's figures over
the earlier one's. A measurement, not a test: nothing here asserts a time.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import re
import secrets
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from pathlib import Path

import aiohttp
import psutil

from llmgw import config
from llmgw.config import PriceConfig, ProfileConfig, ServerConfig
from llmgw.engines.sim_server import API_KEY_ENV
from llmgw.roles.dev import DEV_MODEL, prepare_dev
from llmgw.store import open_store
from llmgw.store.quotas import set_budget, set_limits
from llmgw.store.scopes import DEFAULT_ORG_ID, DEFAULT_PROJECT_ID, DEFAULT_TEAM_ID, Scope

BODY = {"model": DEV_MODEL, "messages": [{"role": "user", "content": "Say hello"}], "max_tokens": 16}
# Each API's path and request: the same prompt and limit.
ROUTES = {
    "chat": ("/v1/chat/completions", BODY),
    "messages": ("/v1/messages", BODY),
    "responses": ("/v1/responses", {"model": DEV_MODEL, "input": "Say hello", "max_output_tokens": 16}),
}
# Limits and budgets the full path checks on every request, high enough never to refuse one.
_NEVER = 10**12


async def _limit_everything(server: ServerConfig) -> None:
    """Limits on the dev key's project, team and org, budgets on its project and org."""
    async with open_store(server.store) as store:
        for scope in (
            Scope("project", DEFAULT_PROJECT_ID),
            Scope("team", DEFAULT_TEAM_ID),
            Scope("org", DEFAULT_ORG_ID),
        ):
            await set_limits(store, scope, rpm=_NEVER, tpm=_NEVER)
        await set_budget(store, Scope("project", DEFAULT_PROJECT_ID), float(_NEVER), "day")
        await set_budget(store, Scope("org", DEFAULT_ORG_ID), float(_NEVER), "month")


@contextmanager
def running_llmgw(
    workdir: Path, auth: bool, database: str = "", loop: str = "asyncio"
) -> Iterator[tuple[str, str, str, str, int]]:
    """(gateway URL, API key, the engine's direct URL, its secret, llmgw's pid) of a dev system with a
    zero-delay sim, run by this Python's llmgw on loop (`llmgw --loop`)."""
    dev_dir = workdir / ".llmgw-dev"
    setup = prepare_dev(dev_dir, ("server",))
    assert setup.server is not None
    model = setup.server.models[0]
    zero_delay = ProfileConfig(engine="sim", args=["--ttft-ms", "0", "--tokens-per-s", "0"])
    server = config.evolve(
        setup.server,
        # Empty: the dev system's SQLite file; a postgresql:// URL: that database.
        database=database or setup.server.database,
        auth=config.evolve(setup.server.auth, enabled=auth),
        models=[config.evolve(model, profiles=[zero_delay])],
    )
    if auth:
        # The full path: prices, so that every request is costed and its budgets counted.
        server = config.evolve(
            server, default_price=PriceConfig(prompt_per_1k=0.001, completion_per_1k=0.002)
        )
        asyncio.run(_limit_everything(server))
    (dev_dir / "server.yaml").write_text(config.dump(server))
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "llmgw",
            "--log-format=json",
            "--log-level=warning",
            # Named only when not the default: an earlier revision's llmgw has no --loop.
            *([f"--loop={loop}"] if loop != "asyncio" else []),
            "--role=server",
            "--role=agent",
            "--dev",
            "--dev-dir",
            str(dev_dir),
            "--listen",
            "127.0.0.1:0",
            # Not the dev system's fixed 9090: a --rev run has two systems up at once.
            "--admin-listen",
            "127.0.0.1:0",
        ],
        cwd=workdir,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        url = key = ""
        assert process.stdout is not None
        for line in process.stdout:
            if found := re.search(r"Gateway: (http://\S+)", line):
                url = found[1]
            if found := re.search(r"API key \(shown once\): (\S+)", line):
                key = found[1]
                break
        deadline = time.monotonic() + 60
        direct = secret = ""
        while not direct and time.monotonic() < deadline:
            for child in psutil.Process(process.pid).children(recursive=True):
                cmd = child.cmdline()
                if "llmgw.engines.sim" in " ".join(cmd) and "--port" in cmd:
                    direct = f"http://127.0.0.1:{cmd[cmd.index('--port') + 1]}"
                    # The engine answers only its replica's secret (from its environment, never argv).
                    secret = child.environ().get(API_KEY_ENV, "")
            time.sleep(0.2)
        if not (url and key and direct):
            raise SystemExit("llmgw did not start its sim engine within 60 s")
        yield url, key, direct, secret, process.pid
    finally:
        process.send_signal(signal.SIGINT)
        process.wait(timeout=60)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@contextmanager
def running_litellm(program: str, workdir: Path, direct: str, secret: str) -> Iterator[tuple[str, str]]:
    """(URL, master key) of LiteLLM's proxy serving the dev model from the engine at `direct`."""
    workdir.mkdir(parents=True, exist_ok=True)
    key = f"sk-{secrets.token_urlsafe(24)}"
    # The engine as an OpenAI-compatible upstream; its secret as the upstream's API key.
    settings = {
        "model_list": [
            {
                "model_name": DEV_MODEL,
                "litellm_params": {
                    "model": f"openai/{DEV_MODEL}",
                    "api_base": f"{direct}/v1",
                    "api_key": secret,
                },
            }
        ],
        "general_settings": {"master_key": key},
    }
    (workdir / "litellm.json").write_text(json.dumps(settings))
    port = _free_port()
    with (workdir / "litellm.log").open("w") as log:
        process = subprocess.Popen(
            [program, "--config", str(workdir / "litellm.json"), "--host", "127.0.0.1", "--port", str(port)],
            cwd=workdir,
            stdout=subprocess.DEVNULL,
            stderr=log,
            # Its price list from the package rather than fetched from the network.
            env={**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True"},
        )
    try:
        yield f"http://127.0.0.1:{port}", key
    finally:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()


# Where the earlier revisions' virtual environments are built, once per commit or wheel.
CACHE = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "llmgw" / "bench"
_REPO = Path(__file__).resolve().parents[1]


def baseline_python(rev: str, cache: Path = CACHE, repo: Path = _REPO) -> Path:
    """A Python with llmgw as it was at rev (a git revision, or a wheel's path), its packages from PyPI.

    Built once in cache (a tree from `git archive`, never a checkout beside this one) and kept.
    """
    if rev.endswith(".whl"):
        wheel = Path(rev).resolve()
        name = f"wheel-{hashlib.sha256(wheel.read_bytes()).hexdigest()[:16]}"
        source = str(wheel)
    else:
        commit = subprocess.run(
            ["git", "-C", str(repo), "rev-parse", "--verify", f"{rev}^{{commit}}"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()
        name = commit
        source = str(cache / name / "tree")
    home = cache / name
    python = home / "venv" / "bin" / "python"
    if (home / "ready").exists():
        return python
    shutil.rmtree(home, ignore_errors=True)
    home.mkdir(parents=True)
    if not rev.endswith(".whl"):
        (home / "tree").mkdir()
        archive = subprocess.Popen(["git", "-C", str(repo), "archive", name], stdout=subprocess.PIPE)
        subprocess.run(["tar", "-x", "-C", source], stdin=archive.stdout, check=True)
        if archive.wait() != 0:
            raise SystemExit(f"git archive {name} failed")
    print(f"building llmgw at {rev} in {home} (once)", file=sys.stderr)
    subprocess.run([sys.executable, "-m", "venv", str(home / "venv")], check=True)
    subprocess.run([str(python), "-m", "pip", "install", "--quiet", source], check=True)
    (home / "ready").write_text(rev + "\n")
    return python


@contextmanager
def running_baseline(
    python: Path, workdir: Path, auth: bool, database: str = ""
) -> Iterator[tuple[str, str, str, str, int]]:
    """running_llmgw's system run by another Python's llmgw (an earlier revision's), until the block ends."""
    process = subprocess.Popen(
        [str(python), __file__, "--serve-side", str(workdir), "on" if auth else "off", database],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        # Its own llmgw, never this tree's.
        env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
    )
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        if not line:
            raise SystemExit(f"llmgw under {python} did not start")
        url, key, direct, secret, pid = json.loads(line)
        yield url, key, direct, secret, pid
    finally:
        assert process.stdin is not None
        process.stdin.close()  # the side's signal to stop its llmgw
        process.wait(timeout=90)


def _serve_side(workdir: str, auth: str, database: str) -> None:
    """Run a system with this Python's llmgw, say where on stdout, and stop when stdin closes."""
    with running_llmgw(Path(workdir), auth == "on", database) as side:
        asyncio.run(_wait_ready(side[0], side[1]))
        print(json.dumps(side), flush=True)
        sys.stdin.read()


def _rss_mb(pid: int) -> float:
    """A process's resident memory, in MB."""
    return psutil.Process(pid).memory_info().rss / 1e6


async def _wait_ready(url: str, key: str) -> None:
    async with aiohttp.ClientSession() as session:
        for _ in range(1200):
            try:
                async with session.post(
                    f"{url}/v1/chat/completions", json=BODY, headers={"Authorization": f"Bearer {key}"}
                ) as reply:
                    await reply.read()
                    if reply.status == 200:
                        return
            except aiohttp.ClientConnectionError:
                pass  # not listening yet: LiteLLM takes a while to start
            await asyncio.sleep(0.1)
    raise SystemExit(f"{url} never answered 200")


async def _load(
    url: str, key: str, concurrency: int, stream: bool, seconds: float, route: str = "chat"
) -> dict[str, float]:
    path, request = ROUTES[route]
    # Chat streams report usage when asked; the other APIs' always do.
    usage = {"stream_options": {"include_usage": True}} if stream and route == "chat" else {}
    body = json.dumps({**request, "stream": stream, **usage})
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
    latencies: list[float] = []
    connector = aiohttp.TCPConnector(limit=concurrency, force_close=False)
    async with aiohttp.ClientSession(connector=connector) as session:

        async def one() -> None:
            start = time.perf_counter()
            async with session.post(f"{url}{path}", data=body, headers=headers) as reply:
                await reply.read()
                if reply.status != 200:
                    raise SystemExit(f"{url} answered {reply.status}")
            latencies.append(time.perf_counter() - start)

        # Warm the connections before measuring.
        await asyncio.gather(*(one() for _ in range(concurrency * 2)))
        latencies.clear()
        stop_at = time.perf_counter() + seconds

        async def worker() -> None:
            while time.perf_counter() < stop_at:
                await one()

        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        elapsed = time.perf_counter() - started
    latencies.sort()
    return {
        "rps": len(latencies) / elapsed,
        "p50_ms": statistics.median(latencies) * 1000,
        "p99_ms": latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))] * 1000,
        "n": float(len(latencies)),
    }


def _measure(
    url: str, key: str, concurrency: int, stream: bool, seconds: float, route: str = "chat"
) -> dict[str, float]:
    # The load generator gets a process of its own, so it never shares a core
    # queue with the gateway it measures.
    code = (
        "import asyncio, json, sys; sys.path.insert(0, sys.argv[1]);"
        "from bench_gateway import _load;"
        "print(json.dumps(asyncio.run(_load(sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5] == '1',"
        " float(sys.argv[6]), sys.argv[7]))))"
    )
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            code,
            str(Path(__file__).parent),
            url,
            key,
            str(concurrency),
            "1" if stream else "0",
            str(seconds),
            route,
        ],
        check=True,
        capture_output=True,
        text=True,
    )
    return json.loads(out.stdout)


def _measure_other(
    url: str, key: str, concurrency: int, stream: bool, seconds: float, route: str
) -> dict[str, float] | str:
    """Another proxy's figures, or what it failed with when it cannot serve a route (the run goes on)."""
    try:
        return _measure(url, key, concurrency, stream, seconds, route)
    except subprocess.CalledProcessError as error:
        return (error.stderr.strip().splitlines() or [f"exit status {error.returncode}"])[-1]


def _cells(d: dict[str, float], other: dict[str, float] | str) -> str:
    if isinstance(other, str):
        return f"failed: {other}"
    return (
        f"{other['rps']:>11.0f} {other['p50_ms']:>6.2f}m {other['p99_ms']:>6.2f}m | "
        f"{other['p50_ms'] - d['p50_ms']:>8.3f}m {other['rps'] / d['rps']:>9.2f}"
    )


# One cell's figures: (auth on, round, route, concurrency, streamed, direct, gateway, LiteLLM's or
# its failure or "", the earlier revision's gateway or None).
Row = tuple[
    bool,
    int,
    str,
    int,
    bool,
    dict[str, float],
    dict[str, float],
    "dict[str, float] | str",
    "dict[str, float] | str | None",
]


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=5.0, help="how long each measurement runs")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 64])
    parser.add_argument(
        "--route",
        choices=sorted(ROUTES),
        nargs="+",
        default=["chat"],
        help="the APIs to measure (default chat)",
    )
    parser.add_argument(
        "--stream",
        choices=["no", "yes", "both"],
        default="both",
        help="streamed requests, plain ones or both",
    )
    parser.add_argument(
        "--auth",
        choices=["off", "on", "both"],
        default="both",
        help="measure the gateway with auth off, the full path (on), or both",
    )
    parser.add_argument(
        "--database",
        default="",
        help="the store: empty for the dev system's SQLite file, or postgresql://USER@HOST[:PORT]/DATABASE "
        "(an empty database of its own)",
    )
    parser.add_argument("--rounds", type=int, default=1, help="how many times each cell is measured, in turn")
    parser.add_argument(
        "--litellm",
        default="",
        metavar="PROGRAM",
        help="LiteLLM's litellm command: measure its proxy on the same engine beside the gateway",
    )
    parser.add_argument(
        "--loop",
        choices=["asyncio", "uvloop"],
        default="asyncio",
        help="the event loop this tree's llmgw runs on (`llmgw --loop`); with --rev, the earlier one "
        "runs on asyncio's own",
    )
    parser.add_argument(
        "--rev",
        default="",
        metavar="REV",
        help="a git revision (or an earlier release's wheel) whose gateway is measured beside this tree's, "
        "in alternating order, with the ratios printed",
    )
    return parser


def _ms(value: float) -> str:
    return f"{value:.3f}m"


def comparison(rows: Sequence[Row], rev: str) -> list[str]:
    """The table of this tree's gateway against rev's, cell by cell: what each adds over the engine's p50,
    the change in it, and requests per second as a ratio (above 1: this tree serves more)."""
    lines = [
        f"this tree against {rev} (added = gateway p50 minus the engine's direct p50; "
        "rps ratio = this tree's requests per second over the earlier one's)",
        f"{'path':<10} {'round':>5} {'route':<9} {'conc':>4} {'stream':>6} | {'direct p50':>10} | "
        f"{'this rps':>8} {'added':>8} | {'before rps':>10} {'added':>8} | "
        f"{'added change':>12} {'rps ratio':>9}",
    ]
    for auth, round_, route, concurrency, stream, d, g, _, before in rows:
        if before is None:
            continue
        cell = (
            f"{'full' if auth else 'auth off':<10} {round_:>5} {route:<9} {concurrency:>4} "
            f"{'yes' if stream else 'no':>6} | {_ms(d['p50_ms']):>10} | "
        )
        this_added = g["p50_ms"] - d["p50_ms"]
        if isinstance(before, str):
            lines.append(cell + f"{g['rps']:>8.0f} {_ms(this_added):>8} | {rev} failed: {before}")
            continue
        before_added = before["p50_ms"] - d["p50_ms"]
        lines.append(
            cell + f"{g['rps']:>8.0f} {_ms(this_added):>8} | {before['rps']:>10.0f} {_ms(before_added):>8} | "
            f"{_ms(this_added - before_added):>12} {g['rps'] / before['rps']:>9.2f}"
        )
    return lines


def _sides(
    stack: ExitStack, tmp: Path, auth: bool, database: str, before: Path | None, loop: str = "asyncio"
) -> tuple[tuple[str, str, str, str, int], tuple[str, str, str, str, int] | None]:
    """This tree's system and, given an earlier revision's Python, that revision's, both ready and at rest."""
    this = stack.enter_context(running_llmgw(tmp / f"auth-{auth}", auth, database, loop))
    asyncio.run(_wait_ready(this[0], this[1]))
    earlier = None
    if before is not None:
        earlier = stack.enter_context(running_baseline(before, tmp / f"before-{auth}", auth, database))
    # At rest: started, one request served, nothing in flight.
    time.sleep(2)
    memory = (
        f"resident memory at rest ({'full' if auth else 'auth off'}): this tree {_rss_mb(this[4]):.0f} MB"
    )
    if earlier is not None:
        memory += f", before {_rss_mb(earlier[4]):.0f} MB"
    print(memory, flush=True)
    return this, earlier


def main(argv: Sequence[str] | None = None) -> None:
    args = parser().parse_args(argv)
    modes = {"off": [False], "on": [True], "both": [False, True]}[args.auth]
    streams = {"no": [False], "yes": [True], "both": [False, True]}[args.stream]
    before_python = baseline_python(args.rev) if args.rev else None
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="llmgw-bench-") as tmp:
        for auth in modes:
            with ExitStack() as stack:
                (url, key, direct, secret, _), earlier = _sides(
                    stack, Path(tmp), auth, args.database, before_python, args.loop
                )
                litellm = ("", "")
                if args.litellm:
                    litellm = stack.enter_context(
                        running_litellm(args.litellm, Path(tmp) / f"litellm-{auth}", direct, secret)
                    )
                    asyncio.run(_wait_ready(*litellm))
                cell = 0
                for round_ in range(1, args.rounds + 1):
                    for route in args.route:
                        for concurrency in args.concurrency:
                            for stream in streams:
                                cell += 1
                                d = _measure(direct, secret, concurrency, stream, args.seconds, route)
                                # An earlier revision may not serve a route yet: its row says how it failed.
                                b: dict[str, float] | str | None = None
                                # The earlier revision first in every other cell, so that neither side
                                # always runs on the cores the other has just warmed or heated.
                                if earlier is not None and cell % 2:
                                    b = _measure_other(*earlier[:2], concurrency, stream, args.seconds, route)
                                g = _measure(url, key, concurrency, stream, args.seconds, route)
                                if earlier is not None and b is None:
                                    b = _measure_other(*earlier[:2], concurrency, stream, args.seconds, route)
                                other: dict[str, float] | str = ""
                                if args.litellm:
                                    other = _measure_other(*litellm, concurrency, stream, args.seconds, route)
                                rows.append((auth, round_, route, concurrency, stream, d, g, other, b))
    print(
        f"{'path':<10} {'round':>5} {'route':<9} {'conc':>4} {'stream':>6} | "
        f"{'direct rps':>10} {'p50':>7} {'p99':>7} | "
        f"{'gateway rps':>11} {'p50':>7} {'p99':>7} | {'added p50':>9} {'rps ratio':>9}"
        + (
            f" | {'litellm rps':>11} {'p50':>7} {'p99':>7} | {'added p50':>9} {'rps ratio':>9}"
            if args.litellm
            else ""
        )
    )
    for auth, round_, route, concurrency, stream, d, g, other, _ in rows:
        print(
            f"{'full' if auth else 'auth off':<10} {round_:>5} {route:<9} {concurrency:>4} "
            f"{'yes' if stream else 'no':>6} | "
            f"{d['rps']:>10.0f} {d['p50_ms']:>6.2f}m {d['p99_ms']:>6.2f}m | "
            + _cells(d, g)
            + (f" | {_cells(d, other)}" if args.litellm else "")
        )
    print(
        "(m = milliseconds; 'added p50' = gateway (or LiteLLM) p50 minus direct p50; "
        "'full' = auth, limits, budgets and usage on)"
    )
    if args.rev:
        print("\n".join(comparison(rows, args.rev)))


if __name__ == "__main__":
    if sys.argv[1:2] == ["--serve-side"]:
        # One side of a --rev run, under the earlier revision's Python (running_baseline).
        _serve_side(*sys.argv[2:5])
    else:
        main()
