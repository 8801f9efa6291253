"""scripts/build-image.sh's choice of interpreter, checked before anything is built.

The image itself is built by tests/deploy (root, podman, mmdebstrap); here a copy of the
script runs in a tree of its own with a `python3` stand-in that has no pip, so that it stops
right after saying which interpreter it chose.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "build-image.sh"


def _tree(tmp_path: Path) -> Path:
    """A checkout holding the script, without a virtual environment."""
    tree = tmp_path / "checkout"
    (tree / "scripts").mkdir(parents=True)
    shutil.copy(SCRIPT, tree / "scripts" / "build-image.sh")
    return tree


def _pipless(path: Path) -> Path:
    """An interpreter whose `-m pip` is missing, as Debian's python3 without python3-pip."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\necho '/usr/bin/python3: No module named pip' >&2\nexit 1\n")
    path.chmod(0o755)
    return path


def _run(tree: Path, path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if k != "PYTHON"}
    return subprocess.run(
        ["bash", str(tree / "scripts" / "build-image.sh")],
        env={**clean, "PATH": f"{path}:/usr/bin:/bin", **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_without_python_or_a_venv_it_takes_python3_from_the_path_and_says_so(tmp_path: Path) -> None:
    """It failed with ".venv/bin/python: No such file or directory" unless PYTHON was set."""
    tree = _tree(tmp_path)
    python3 = _pipless(tmp_path / "bin" / "python3")
    done = _run(tree, python3.parent)
    assert done.returncode == 1
    assert f"no PYTHON and no {tree}/.venv: using {python3}" in done.stderr
    assert (
        f"{python3} has no pip, which builds the image's wheels: apt-get install python3-pip" in done.stderr
    )
    assert "No such file or directory" not in done.stderr


def test_the_trees_virtual_environment_comes_before_python3(tmp_path: Path) -> None:
    tree = _tree(tmp_path)
    venv = _pipless(tree / ".venv" / "bin" / "python")
    done = _run(tree, _pipless(tmp_path / "bin" / "python3").parent)
    assert done.returncode == 1
    assert done.stderr.strip() == (
        f"build-image: {venv} has no pip, which builds the image's wheels: apt-get install python3-pip, "
        "or set PYTHON to an interpreter with pip (a virtual environment's)"
    )
