"""The committed protocol code is what `make proto` generates."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parent.parent


def test_the_committed_proto_code_is_not_stale(tmp_path: Path) -> None:
    bindir = str(Path(sys.executable).parent)
    env = {**os.environ, "PATH": f"{bindir}:{os.environ.get('PATH', '')}"}
    subprocess.run(
        [
            sys.executable,
            "-m",
            "grpc_tools.protoc",
            "-I",
            str(ROOT / "protos"),
            f"--python_betterproto_out={tmp_path}",
            str(ROOT / "protos/llmgw/v1/agent.proto"),
        ],
        check=True,
        env=env,
        capture_output=True,
    )
    fresh = (tmp_path / "llmgw/v1/__init__.py").read_text()
    committed = (ROOT / "src/llmgw/proto/llmgw/v1/__init__.py").read_text()
    assert fresh == committed, "src/llmgw/proto is stale: run `make proto` and commit the result"
