"""What tests of an agent restarting into another release share."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture
def broken_release(tmp_path: Path) -> Path:
    """A directory to put on PYTHONPATH whose llmgw's command line cannot be imported."""
    broken = tmp_path / "release" / "llmgw" / "cli"
    broken.mkdir(parents=True)
    (broken.parent / "__init__.py").write_text("")
    (broken / "__init__.py").write_text("")
    (broken / "main.py").write_text('raise ImportError("this build is broken")\n')
    return tmp_path / "release"
