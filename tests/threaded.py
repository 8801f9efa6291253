"""An aiohttp app served on a loopback port from a thread of its own, for tests that are not async.

A fuzzer that makes its requests synchronously (schemathesis, hypothesis) drives it
from the test's thread; the server runs as in production, its logger included.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Callable, Iterator
from contextlib import AbstractAsyncContextManager
from pathlib import Path

from aiohttp import web

from llmgw.bodies import SERVER_OPTIONS
from llmgw.store import Store, open_store

AppFactory = Callable[[Store], AbstractAsyncContextManager[web.Application]]


@contextlib.contextmanager
def serve_in_thread(make_app: AppFactory, root: Path) -> Iterator[str]:
    """Serve the app make_app builds over a fresh store in root; yields its base URL."""
    ready = threading.Event()
    loop = asyncio.new_event_loop()
    stop: list[asyncio.Event] = []
    found: list[str | BaseException] = []

    async def serve() -> None:
        stop.append(asyncio.Event())
        async with open_store(root / "llmgw.db") as store, make_app(store) as app:
            runner = web.AppRunner(app, access_log=None, **SERVER_OPTIONS)
            await runner.setup()
            try:
                await web.TCPSite(runner, "127.0.0.1", 0).start()
                host, port = runner.addresses[0][:2]
                found.append(f"http://{host}:{port}")
                ready.set()
                await stop[0].wait()
            finally:
                await runner.cleanup()

    def run() -> None:
        try:
            loop.run_until_complete(serve())
        except BaseException as exc:
            found.append(exc)
            ready.set()
        finally:
            loop.close()

    thread = threading.Thread(target=run, name="served-app", daemon=True)
    thread.start()
    assert ready.wait(30), "the app did not start"
    if isinstance(found[0], BaseException):
        raise found[0]
    try:
        yield found[0]
    finally:
        loop.call_soon_threadsafe(stop[0].set)
        thread.join(30)


class ErrorRecords(logging.Handler):
    """Every log record at ERROR or above, or with a traceback: from aiohttp, or anything using logging."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.exc_info or record.levelno >= logging.ERROR:
            self.records.append(record)


@contextlib.contextmanager
def error_records() -> Iterator[ErrorRecords]:
    handler = ErrorRecords()
    root = logging.getLogger()
    root.addHandler(handler)
    try:
        yield handler
    finally:
        root.removeHandler(handler)
