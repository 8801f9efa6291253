"""`llmgw --role=mirror --config mirror.yaml`: the third role runs alone, serves files, stops on a signal."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import urllib.request
from pathlib import Path

import pytest

from .conftest import _pump, wait_until

pytestmark = pytest.mark.e2e


def test_the_mirror_role_serves_its_files_and_stops_cleanly_on_sigterm(tmp_path: Path) -> None:
    root = tmp_path / "models"
    (root / "tiny").mkdir(parents=True)
    (root / "tiny" / "model.gguf").write_bytes(b"GGUF" + bytes(60))
    cfg = tmp_path / "mirror.yaml"
    cfg.write_text(f"listen: 127.0.0.1:0\nroot: {root}\n", encoding="utf-8")
    process = subprocess.Popen(
        [sys.executable, "-m", "llmgw", "--log-format=json", "--role=mirror", "--config", str(cfg)],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    output: list[str] = []
    pump = threading.Thread(target=_pump, args=(process.stdout, output, threading.Event()), daemon=True)
    pump.start()
    try:

        def serving() -> dict[str, str] | None:
            for line in output:
                if line.startswith("{") and json.loads(line)["event"] == "mirror serving":
                    return json.loads(line)  # type: ignore[no-any-return]
            return None

        wait_until(lambda: serving() is not None or process.poll() is not None, 30, "the mirror to serve")
        started = serving()
        assert started is not None, "\n".join(output)
        with urllib.request.urlopen(f"{started['url']}/files/tiny/", timeout=10) as reply:
            assert json.load(reply) == {"files": [{"path": "model.gguf", "size": 64}]}
        with urllib.request.urlopen(f"{started['url']}/files/tiny/model.gguf", timeout=10) as reply:
            assert reply.read()[:4] == b"GGUF"
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=30) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        pump.join(timeout=10)
        assert process.stdout is not None
        process.stdout.close()
