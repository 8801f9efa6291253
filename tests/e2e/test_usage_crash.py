"""A server killed with SIGKILL under load keeps the usage of every reply its clients received whole."""

from __future__ import annotations

import contextlib
import http.client
import json
import signal
import sqlite3
import threading
import time
from pathlib import Path
from urllib.parse import urlsplit

import psutil
import pytest

from tests.e2e.conftest import launch_dev

pytestmark = pytest.mark.slow

# The sim's count: three prompt tokens, three completion tokens, deterministic.
_PLAIN = {"model": "sim-chat", "messages": [{"role": "user", "content": "one two three"}], "max_tokens": 8}
# Streamed without asking for usage, as most clients stream.
_STREAMED = {**_PLAIN, "stream": True}


def _client(url: str, key: str, body: dict[str, object], stop: threading.Event, done: list[int]) -> None:
    """Post body until stop; append 1 for each reply received whole (status 200, its whole body)."""
    where = urlsplit(url)
    data = json.dumps(body).encode()
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
    while not stop.is_set():
        connection = http.client.HTTPConnection(where.hostname, where.port, timeout=10)
        try:
            connection.request("POST", "/v1/chat/completions", data, headers)
            reply = connection.getresponse()
            payload = reply.read()
        except (OSError, http.client.HTTPException):
            return
        finally:
            connection.close()
        whole = payload.endswith(b"data: [DONE]\n\n") if body.get("stream") else b'"usage"' in payload
        if reply.status == 200 and whole:
            done.append(1)


def _stored(database: Path, key: str) -> tuple[int, int, int]:
    """(requests, prompt tokens, completion tokens) answered 200 for the key, from the store."""
    with sqlite3.connect(database) as db:
        ids = [i for i, prefix in db.execute("SELECT id, prefix FROM api_keys") if key.startswith(prefix)]
        (key_id,) = ids
        row = db.execute(
            "SELECT COALESCE(SUM(requests), 0), COALESCE(SUM(prompt_tokens), 0),"
            " COALESCE(SUM(completion_tokens), 0) FROM usage_daily WHERE key_id = ? AND status = 200",
            (key_id,),
        ).fetchone()
    return int(row[0]), int(row[1]), int(row[2])


def test_a_server_killed_under_load_keeps_the_usage_of_every_reply_its_clients_received(
    tmp_path: Path,
) -> None:
    stop = threading.Event()
    completed: list[list[int]] = [[] for _ in range(12)]
    with launch_dev(tmp_path) as first:
        clients = [
            threading.Thread(
                target=_client,
                args=(first.url, first.key, _STREAMED if i % 2 else _PLAIN, stop, completed[i]),
                daemon=True,
            )
            for i in range(12)
        ]
        for client in clients:
            client.start()
        # Long enough that the writer has moved some usage to the store and some waits for it.
        deadline = time.monotonic() + 30
        while sum(map(len, completed)) < 400 and time.monotonic() < deadline:
            time.sleep(0.05)
        engines = first.children()
        first.process.send_signal(signal.SIGKILL)
        first.process.wait()
        stop.set()
        for client in clients:
            client.join(timeout=30)
        for engine in engines:
            # Orphaned by the kill: the agent that would have stopped them died with the server.
            with contextlib.suppress(psutil.NoSuchProcess):
                engine.kill()
        key = first.key
    received = sum(map(len, completed))
    assert received >= 400
    (database,) = tmp_path.glob(".llmgw-dev/**/llmgw.db")
    before = _stored(database, key)
    # A restart replays the journal into the store before it serves.
    with launch_dev(tmp_path):
        pass
    requests, prompt, completion = _stored(database, key)
    # The readiness probe of the first start is one more request, "hi" for one token.
    probe = 1
    # No reply a client received whole is missing. A request can also be counted that its client did
    # not receive whole: journaled, then killed before its last bytes went out (at most one per client).
    assert received + probe <= requests <= received + probe + len(clients)
    assert (prompt, completion) == (3 * (requests - probe) + 1, 3 * (requests - probe) + 1)
    # And the kill did lose some from memory: without the journal, this test would fail.
    assert before[0] < requests
