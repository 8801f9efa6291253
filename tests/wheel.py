"""A wheel of llmgw built from this working tree, as a release an agent is upgraded to or a bundle ships."""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def build_wheel(out: Path, scratch: Path, change: Callable[[Path], None] | None = None) -> None:
    """llmgw's wheel into out, built in a copy of the tree at scratch: the tree gets no build/ of its own.

    change: called with the copy's src/llmgw before the build (another version, a broken module).
    """
    shutil.rmtree(scratch, ignore_errors=True)
    shutil.copytree(ROOT / "src", scratch / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    for name in ("setup.cfg", "pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, scratch / name)
    if change is not None:
        change(scratch / "src" / "llmgw")
    argv = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q"]
    subprocess.run([*argv, "-w", str(out), str(scratch)], check=True, timeout=300)
