#!/usr/bin/env python3
"""Where the gateway's CPU goes, by stage of the request path: py-spy's samples over a bench run.

    scripts/profile_stages.py [--concurrency 64] [--stream] [--route chat] [--seconds 8]
    scripts/profile_stages.py --stacks FILE      # classify stacks py-spy already recorded (--format raw)

Starts bench_gateway.py's dev system with the full path on (a key, limits, budgets, prices, usage),
records the gateway process with py-spy (`pip install py-spy`; it is no dependency of llmgw) while the
bench's load generator drives it, and gives each sample to the stage of the innermost llmgw frame on
its stack. Prints each stage's share of the samples and, in brackets, the share whose innermost frame
is llmgw's own code rather than a library it calls. A measurement, not a test.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Sequence
from pathlib import Path

# A frame's file, as py-spy writes it ("name (llmgw/gateway/auth.py:12)"), to its stage; the first match wins.
STAGES = (
    ("auth", ("llmgw/gateway/auth.py",)),
    (
        "admission",
        (
            "llmgw/gateway/admission.py",
            "llmgw/gateway/allowance.py",
            "llmgw/gateway/quotas.py",
            "llmgw/gateway/access.py",
            "llmgw/gateway/checks.py",
        ),
    ),
    (
        "router",
        (
            "llmgw/gateway/router.py",
            "llmgw/gateway/affinity.py",
            "llmgw/gateway/endpoints.py",
            "llmgw/gateway/history.py",
            "llmgw/control/inventory.py",
            "llmgw/routes.py",
        ),
    ),
    (
        "proxy",
        (
            "llmgw/gateway/proxy.py",
            "llmgw/gateway/deadlines.py",
            "llmgw/gateway/streams.py",
            "llmgw/gateway/faults.py",
            "llmgw/gateway/upstream.py",
            "llmgw/gateway/translation.py",
        ),
    ),
    ("read body", ("llmgw/gateway/pipeline.py", "llmgw/bodies.py", "llmgw/gateway/apis.py")),
    ("usage", ("llmgw/gateway/usage.py", "llmgw/gateway/journal.py", "llmgw/store/", "aiosqlite/")),
    ("metrics", ("llmgw/gateway/metrics.py",)),
)
# The frames every stack starts with (the command line, the roles, the loop's run): never a stage.
_OUTER = ("llmgw/cli/", "llmgw/roles/", "llmgw/__main__")


def stage_of(frames: Sequence[str]) -> str:
    """The stage a sample's stack (outermost frame first) is spent in."""
    if any("structlog/" in frame or "llmgw/log.py" in frame for frame in frames):
        return "logging"
    for frame in reversed(frames):
        if ("llmgw/" in frame and not any(outer in frame for outer in _OUTER)) or "aiosqlite/" in frame:
            return next((name for name, files in STAGES if any(f in frame for f in files)), "other llmgw")
    leaf = frames[-1] if frames else ""
    if "select (selectors.py" in leaf:
        return "waiting in epoll"
    stack = ";".join(frames)
    if "aiohttp/web_" in stack or "http_parser" in stack or "http_writer" in stack:
        return "aiohttp server, outside the stages"
    if "aiohttp/client" in stack or "aiohttp/connector" in stack:
        return "aiohttp client, outside the stages"
    if "asyncio/" in leaf:
        return "the asyncio loop"
    return "other"


def shares(lines: Iterable[str]) -> list[tuple[str, float, float]]:
    """(stage, share of the samples, share whose innermost frame is llmgw's) from py-spy's raw stacks."""
    total: collections.Counter[str] = collections.Counter()
    own: collections.Counter[str] = collections.Counter()
    for line in lines:
        stack, _, count = line.rstrip().rpartition(" ")
        if not stack or not count.isdigit():
            continue
        frames = stack.split(";")
        stage = stage_of(frames)
        total[stage] += int(count)
        if "llmgw/" in frames[-1]:
            own[stage] += int(count)
    samples = sum(total.values()) or 1
    return [(stage, n / samples, own[stage] / samples) for stage, n in total.most_common()]


def _record(out: Path, concurrency: int, stream: bool, route: str, seconds: float) -> None:
    sys.path.insert(0, str(Path(__file__).parent))
    from bench_gateway import _measure, _wait_ready, running_llmgw

    record = ["py-spy", "record", "--rate", "400", "--nonblocking", "--format", "raw", "--output", str(out)]
    with (
        tempfile.TemporaryDirectory(prefix="llmgw-profile-") as tmp,
        running_llmgw(Path(tmp), True) as (url, key, _, _, pid),
    ):
        asyncio.run(_wait_ready(url, key))
        _measure(url, key, concurrency, stream, 1.0, route)  # warm
        spy = subprocess.Popen(
            [*record, "--pid", str(pid), "--duration", str(int(seconds))], stdout=subprocess.DEVNULL
        )
        _measure(url, key, concurrency, stream, seconds, route)
        if spy.wait() != 0:
            raise SystemExit("py-spy failed: is it installed (pip install py-spy), and may it trace?")


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--stream", action="store_true", help="streamed requests")
    parser.add_argument("--route", default="chat", choices=["chat", "messages", "responses"])
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--stacks", type=Path, help="classify this py-spy raw output instead of recording")
    args = parser.parse_args(argv)
    stacks = args.stacks
    if stacks is None:
        stacks = Path(tempfile.mkdtemp(prefix="llmgw-profile-")) / "stacks.txt"
        _record(stacks, args.concurrency, args.stream, args.route, args.seconds)
    for stage, share, own in shares(stacks.read_text().splitlines()):
        print(f"{stage:<36} {share:>6.1%}  ({own:.1%} in llmgw's own lines)")


if __name__ == "__main__":
    main()
