"""scripts/bench_routing.py runs the routing policies side by side on two real llama-server replicas.

A small run of the benchmark the routing figures in docs/benchmarks.md come from: it must start the
replicas, put each policy in front of them, and report the times and the engines' own cache figures.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).parents[2] / "scripts" / "bench_routing.py"
# Two conversations of two turns per policy: seconds, not the minutes of the documented runs.
SMALL = ["--workload", "support", "--conversations", "2", "--turns", "2", "--rate", "4", "--rounds", "1"]
SMALL += ["--max-tokens", "4", "--policies", "least_in_flight,prefix"]


@pytest.mark.usefixtures("llama_server")
def test_it_reports_each_policys_times_and_the_engines_cache_figures_side_by_side(tmp_path: Path) -> None:
    run = subprocess.run(
        [sys.executable, str(SCRIPT), *SMALL],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
        check=False,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    rows = {
        line.split()[0]: line.split()
        for line in run.stdout.splitlines()
        if line.split() and line.split()[0] in ("least_in_flight", "prefix")
    }
    assert set(rows) == {"least_in_flight", "prefix"}, run.stdout
    for policy, row in rows.items():
        # TTFT p50 and p95, then the engine's prompt tokens processed of those sent, and no errors.
        assert re.fullmatch(r"\d+ms", row[1]) and re.fullmatch(r"\d+ms", row[2]), (policy, row)
        processed, sent = (int(n.replace(",", "")) for n in row[7].split("/"))
        assert 0 < processed <= sent, (policy, row)
        assert row[-1] == "0", (policy, row)
