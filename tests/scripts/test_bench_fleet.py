"""scripts/bench_fleet.py --nodes N measures how many nodes one control plane holds, in one JSON line.

A small run of the benchmark the fleet figures in docs/benchmarks.md come from: a server, a real agent
with a sim replica, simulated nodes in a process of their own, chat requests through the gateway.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).parents[2] / "scripts" / "bench_fleet.py"
KEYS = {
    "nodes",
    "heartbeat_s",
    "registered_s",
    "server_cpu_pct",
    "server_rss_mb",
    "rss_per_node_kb",
    "cpu_pct_per_1000_nodes",
    "chat_p50_ms",
    "chat_p99_ms",
    "idle_chat_p99_ms",
}


def test_it_registers_every_simulated_node_and_reports_the_figures_asked_for(tmp_path: Path) -> None:
    run = subprocess.run(
        [sys.executable, str(SCRIPT), "--nodes", "40", "--seconds", "2", "--heartbeat-s", "0.5"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
        check=False,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    figures = json.loads(run.stdout.strip().splitlines()[-1])
    assert set(figures) >= KEYS, figures
    assert figures["nodes"] == 40 and figures["registered"] == 40 and figures["failed"] == {}
    assert figures["heartbeat_s"] == 0.5 and figures["fleet_nice"] == 19
    # Every chat request of both phases was answered (20 a second for 2 s each).
    assert figures["chats"] >= 30 and figures["chat_p99_ms"] > 0 and figures["idle_chat_p99_ms"] > 0
    assert figures["server_rss_mb"] > 0 and figures["server_cpu_pct"] > 0


def test_a_niceness_out_of_range_is_refused_in_a_sentence() -> None:
    run = subprocess.run(
        [sys.executable, str(SCRIPT), "--nodes", "10", "--fleet-nice", "25"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert run.returncode == 1
    assert run.stderr.strip() == (
        "bench_fleet: --fleet-nice is a niceness from 0 (the server's) to 19 (the lowest)"
    )
