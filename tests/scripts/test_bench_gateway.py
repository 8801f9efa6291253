"""scripts/bench_gateway.py's command line and its table of this tree against an earlier revision.

The benchmark itself is run by hand (`make bench`): tests never measure time. These hold what it reads
from its command line and what it prints from figures given to it.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

SCRIPT = Path(__file__).parents[2] / "scripts" / "bench_gateway.py"


def _script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_gateway", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_gateway"] = module
    spec.loader.exec_module(module)
    return module


def _figures(rps: float, p50_ms: float) -> dict[str, float]:
    return {"rps": rps, "p50_ms": p50_ms, "p99_ms": p50_ms * 2, "n": rps}


def test_a_revision_routes_and_rounds_are_read_from_the_command_line() -> None:
    args = (
        _script()
        .parser()
        .parse_args(
            ["--rev", "2d42d73", "--route", "chat", "messages", "responses", "--rounds", "3", "--auth", "on"]
        )
    )
    assert (args.rev, args.route, args.rounds, args.auth) == (
        "2d42d73",
        ["chat", "messages", "responses"],
        3,
        "on",
    )
    assert _script().parser().parse_args([]).rev == ""


def test_the_comparison_gives_each_cell_this_trees_added_latency_and_throughput_over_the_earlier_ones() -> (
    None
):
    direct = _figures(4000, 0.300)
    rows = [
        (True, 1, "chat", 1, False, direct, _figures(1250, 0.800), "", _figures(1000, 0.900)),
        (True, 1, "messages", 64, True, direct, _figures(1500, 30.0), "", _figures(2000, 25.0)),
        # A route the earlier revision did not serve yet: its failure, in its row.
        (True, 1, "responses", 1, False, direct, _figures(1000, 1.0), "", "http://x answered 404"),
        # Measured without an earlier revision: not in the comparison.
        (False, 1, "chat", 1, False, direct, _figures(1000, 1.0), "", None),
    ]
    lines = _script().comparison(rows, "2d42d73")
    assert "against 2d42d73" in lines[0]
    assert len(lines) == 5
    chat, messages = lines[2].split(), lines[3].split()
    assert lines[4].endswith("2d42d73 failed: http://x answered 404")
    # added 0.5 ms against 0.6 ms: 0.1 ms less; 1,250 requests a second against 1,000.
    assert chat[:5] == ["full", "1", "chat", "1", "no"]
    assert chat[-2:] == ["-0.100m", "1.25"]
    assert messages[-2:] == ["5.000m", "0.75"]


def test_an_earlier_revisions_environment_is_built_once_and_then_reused(tmp_path: Path) -> None:
    repo = SCRIPT.parents[1]
    head = subprocess.run(
        ["git", "-C", str(repo), "rev-parse", "HEAD"], check=True, capture_output=True, text=True
    ).stdout.strip()
    (tmp_path / head).mkdir()
    (tmp_path / head / "ready").write_text("HEAD\n")
    python = _script().baseline_python("HEAD", cache=tmp_path, repo=repo)
    assert python == tmp_path / head / "venv" / "bin" / "python"
    # Nothing was built: the cache's entry was taken as it was.
    assert sorted(p.name for p in (tmp_path / head).iterdir()) == ["ready"]
