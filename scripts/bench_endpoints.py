#!/usr/bin/env python3
"""What the gateway adds in front of an endpoint outside the fleet: a server called directly, then via llmgw.

Starts a zero-delay sim engine on its own as the "existing server" (it requires
its key, as a cloud API does), and `llmgw --role=server --dev` with one model
whose `endpoints` lead to it, under another name (so each request's model is
rewritten), its key from the environment. Drives both with bench_gateway.py's
load generator in a process of its own, at each concurrency, streamed and not.
A measurement, not a test: nothing here asserts a time.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import aiohttp

from llmgw import config
from llmgw.config import EndpointConfig, ModelConfig, PriceConfig
from llmgw.engines.sim_words import API_KEY_ENV
from llmgw.roles.dev import prepare_dev

sys.path.insert(0, str(Path(__file__).parent))
from bench_gateway import BODY, _limit_everything

UPSTREAM = "upstream-model"
CATALOG = "ext-chat"
_KEY_ENV = "LLMGW_BENCH_UPSTREAM_KEY"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@contextmanager
def running(workdir: Path, auth: bool) -> Iterator[tuple[str, str, str, str]]:
    """(gateway URL, its API key, the upstream's URL, the upstream's key)."""
    secret = secrets.token_urlsafe(24)
    port = _free_port()
    upstream = subprocess.Popen(
        [sys.executable, "-m", "llmgw.engines.sim", "--port", str(port), "--model", UPSTREAM],
        env={**os.environ, API_KEY_ENV: secret},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    dev_dir = workdir / ".llmgw-dev"
    setup = prepare_dev(dev_dir, ("server",))
    assert setup.server is not None
    endpoint = EndpointConfig(url=f"http://127.0.0.1:{port}/v1", model=UPSTREAM, api_key_env=_KEY_ENV)
    server = config.evolve(
        setup.server,
        auth=config.evolve(setup.server.auth, enabled=auth),
        models=[ModelConfig(name=CATALOG, endpoints=[endpoint])],
        control=config.evolve(setup.server.control, endpoint_check_s=1.0),
    )
    if auth:
        server = config.evolve(
            server, default_price=PriceConfig(prompt_per_1k=0.001, completion_per_1k=0.002)
        )
        asyncio.run(_limit_everything(server))
    (dev_dir / "server.yaml").write_text(config.dump(server))
    process = subprocess.Popen(
        [
            *(sys.executable, "-m", "llmgw", "--log-format=json", "--log-level=warning", "--role=server"),
            *("--dev", "--dev-dir", str(dev_dir), "--listen", "127.0.0.1:0"),
        ],
        cwd=workdir,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1", _KEY_ENV: secret},
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
        yield url, key, f"http://127.0.0.1:{port}", secret
    finally:
        process.send_signal(signal.SIGINT)
        process.wait(timeout=60)
        upstream.terminate()
        upstream.wait(timeout=30)


async def _wait_ready(url: str, key: str, model: str) -> None:
    async with aiohttp.ClientSession() as session:
        for _ in range(600):
            try:
                async with session.post(
                    f"{url}/v1/chat/completions",
                    json={**BODY, "model": model},
                    headers={"Authorization": f"Bearer {key}"},
                ) as reply:
                    await reply.read()
                    if reply.status == 200:
                        return
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.1)
    raise SystemExit(f"{url} never answered 200 for {model}")


def _measure(
    url: str, key: str, model: str, concurrency: int, stream: bool, seconds: float
) -> dict[str, float]:
    # The load generator gets a process of its own, so it never shares a core queue with what it measures.
    code = (
        "import asyncio, json, sys; sys.path.insert(0, sys.argv[1]); import bench_gateway as b;"
        "b.BODY = {**b.BODY, 'model': sys.argv[7]};"
        "print(json.dumps(asyncio.run(b._load(sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5] == '1',"
        " float(sys.argv[6])))))"
    )
    argv = [
        str(Path(__file__).parent),
        url,
        key,
        str(concurrency),
        "1" if stream else "0",
        str(seconds),
        model,
    ]
    out = subprocess.run([sys.executable, "-c", code, *argv], check=True, capture_output=True, text=True)
    result: dict[str, float] = json.loads(out.stdout)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=5.0, help="how long each measurement runs")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 64])
    parser.add_argument("--auth", choices=["off", "on", "both"], default="both")
    args = parser.parse_args()
    modes = {"off": [False], "on": [True], "both": [False, True]}[args.auth]
    rows = []
    with tempfile.TemporaryDirectory(prefix="llmgw-bench-endpoints-") as tmp:
        for auth in modes:
            with running(Path(tmp) / f"auth-{auth}", auth) as (url, key, direct, secret):
                asyncio.run(_wait_ready(direct, secret, UPSTREAM))
                asyncio.run(_wait_ready(url, key, CATALOG))
                for concurrency in args.concurrency:
                    for stream in (False, True):
                        d = _measure(direct, secret, UPSTREAM, concurrency, stream, args.seconds)
                        g = _measure(url, key, CATALOG, concurrency, stream, args.seconds)
                        rows.append((auth, concurrency, stream, d, g))
    print(
        f"{'path':<10} {'conc':>4} {'stream':>6} | {'direct rps':>10} {'p50':>7} {'p99':>7} | "
        f"{'gateway rps':>11} {'p50':>7} {'p99':>7} | {'added p50':>9} {'rps ratio':>9}"
    )
    for auth, concurrency, stream, d, g in rows:
        print(
            f"{'full' if auth else 'auth off':<10} {concurrency:>4} {'yes' if stream else 'no':>6} | "
            f"{d['rps']:>10.0f} {d['p50_ms']:>6.2f}m {d['p99_ms']:>6.2f}m | "
            f"{g['rps']:>11.0f} {g['p50_ms']:>6.2f}m {g['p99_ms']:>6.2f}m | "
            f"{g['p50_ms'] - d['p50_ms']:>8.3f}m {g['rps'] / d['rps']:>9.2f}"
        )
    print(
        "(m = milliseconds; 'added p50' = gateway p50 minus direct p50; "
        "'full' = auth, limits, budgets and usage on)"
    )


if __name__ == "__main__":
    main()
