"""Logging: structlog, readable on a terminal, JSON lines elsewhere, and a ring in memory.

The ring keeps this process's last lines so the admin pages and `llmgw ctl
logs` can show what a node did without anyone opening a shell on it.
"""

from __future__ import annotations

import collections
import logging
import sys
import threading
from collections.abc import Sequence
from typing import Any, TextIO

import structlog

AGENT_RING_LINES = 2000


class LogRing:
    """The newest `capacity` lines, oldest first; safe to read while another thread writes."""

    def __init__(self, capacity: int = AGENT_RING_LINES) -> None:
        self._lines: collections.deque[str] = collections.deque(maxlen=capacity)
        self._lock = threading.Lock()

    @property
    def capacity(self) -> int:
        return self._lines.maxlen or 0

    def append(self, line: str) -> None:
        with self._lock:
            self._lines.append(line)

    def tail(self, n: int | None = None) -> list[str]:
        with self._lock:
            lines = list(self._lines)
        return lines if n is None or n >= len(lines) else lines[len(lines) - n :]


RING = LogRing()


class _TeeFile:
    """What structlog prints to: the real stream and the ring."""

    def __init__(self, stream: TextIO, ring: LogRing) -> None:
        self._stream = stream
        self._ring = ring

    def write(self, text: str) -> int:
        for line in text.splitlines():
            if line:
                self._ring.append(line)
        # Logging a line to stderr is the one write the loop is allowed: it is
        # small, and an agent that hides its log to save a syscall is worse.
        return self._stream.write(text)

    def flush(self) -> None:
        self._stream.flush()


def setup(*, level: str = "info", json: bool | None = None, stream: TextIO | None = None) -> None:
    """Configure structlog once per process; `json=None` chooses by whether stream is a terminal."""
    out = stream or sys.stderr
    as_json = not out.isatty() if json is None else json
    # A plain traceback, never rich's: rich (pulled in by a test tool) reads and stats source
    # files while rendering, on the event loop, and a logged exception must not stall the gateway.
    renderer: Any = (
        structlog.processors.JSONRenderer()
        if as_json
        else structlog.dev.ConsoleRenderer(
            colors=out.isatty(), exception_formatter=structlog.dev.plain_traceback
        )
    )
    processors: Sequence[Any] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        structlog.processors.format_exc_info,
        renderer,
    ]
    structlog.configure(
        processors=list(processors),
        wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelNamesMapping()[level.upper()]),
        logger_factory=structlog.PrintLoggerFactory(file=_TeeFile(out, RING)),  # type: ignore[arg-type]
        cache_logger_on_first_use=False,
    )
