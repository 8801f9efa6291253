"""The in-memory ring of a process's log lines."""

from __future__ import annotations

import io
import json

import structlog

from llmgw import log
from llmgw.log import LogRing


class TestLogRing:
    def test_the_ring_keeps_the_newest_lines_in_order_across_wrap_around(self):
        ring = LogRing(capacity=5)
        for i in range(1, 13):
            ring.append(f"line {i}")
        assert ring.tail() == [f"line {i}" for i in range(8, 13)]
        assert ring.tail(2) == ["line 11", "line 12"]
        # Asking for more than it holds gives all it holds, oldest first.
        assert ring.tail(100) == ring.tail()

    def test_a_ring_that_has_not_wrapped_gives_every_line(self):
        ring = LogRing(capacity=5)
        ring.append("only")
        assert ring.tail(3) == ["only"]

    def test_the_agents_ring_keeps_2000_lines(self):
        assert LogRing().capacity == 2000


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_log_lines_are_json_when_not_written_to_a_terminal() -> None:
    out = io.StringIO()
    log.setup(stream=out)
    try:
        structlog.get_logger("t").info("engine ready", shard="s1")
    finally:
        log.setup()
    record = json.loads(out.getvalue().splitlines()[-1])
    assert record["event"] == "engine ready" and record["shard"] == "s1" and record["level"] == "info"


def test_log_lines_are_for_a_person_on_a_terminal_and_kept_in_the_ring() -> None:
    out = _Terminal()
    log.setup(stream=out)
    try:
        structlog.get_logger("t").warning("no AVX2 here", node="n1")
    finally:
        log.setup()
    line = out.getvalue().splitlines()[-1]
    assert "no AVX2 here" in line and "node" in line and not line.startswith("{")
    assert any("no AVX2 here" in kept for kept in log.RING.tail(5))
