"""scripts/gpu-check.sh on a machine without a GPU: its arguments, and the JSON line it still prints.

The GPU steps themselves run only where there is a GPU (docs/engines.md, Checking on a GPU
machine); these keep the script from rotting in between.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "gpu-check.sh"


def gpu_check(*args: str, work: Path) -> tuple[int, dict[str, Any], str]:
    """Run the script with this interpreter; its exit code, its last stdout line as JSON, its stderr."""
    env = {**os.environ, "PYTHON": sys.executable}
    done = subprocess.run(
        [str(SCRIPT), "--work", str(work), *args], capture_output=True, text=True, env=env, timeout=60
    )
    last = done.stdout.strip().splitlines()[-1]
    return done.returncode, json.loads(last), done.stderr


def test_a_dry_run_without_a_gpu_prints_one_json_line_saying_none_was_found(tmp_path: Path) -> None:
    code, said, stderr = gpu_check("--dry-run", work=tmp_path)

    assert code == 1, stderr
    assert said["dry_run"] is True
    assert said["nvml"]["gpus"] == []
    assert said["llamacpp_cuda"] is None and said["vllm_cuda"] is None
    assert said["errors"] == ["no GPU was found: no NVIDIA driver is loaded; nothing was installed or served"]
    assert list(tmp_path.iterdir()) == [], "a dry run installed or wrote something"


def test_without_a_gpu_a_real_run_installs_nothing_either(tmp_path: Path) -> None:
    code, said, _ = gpu_check("--budget-s", "60", work=tmp_path)

    assert code == 1
    assert said["dry_run"] is False and said["nvml"]["gpus"] == []
    assert said["errors"][0].startswith("no GPU was found")
    assert list(tmp_path.iterdir()) == []


def test_an_unknown_argument_is_still_answered_with_a_json_line(tmp_path: Path) -> None:
    code, said, _ = gpu_check("--gpu", "0", work=tmp_path)

    assert code == 1
    assert said["errors"] == ["unknown argument '--gpu' (try --help)"]


def test_help_says_how_to_run_it(tmp_path: Path) -> None:
    done = subprocess.run([str(SCRIPT), "--help"], capture_output=True, text=True, timeout=60)

    assert done.returncode == 0
    assert "Usage:" in done.stdout and "--dry-run" in done.stdout
