"""Every shell script the project ships is shellcheck-clean."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests import needs

SCRIPTS = sorted((Path(__file__).resolve().parents[2] / "scripts").glob("*.sh"))


def test_the_scripts_are_found() -> None:
    assert {"gpu-check.sh", "onboard-node.sh"} <= {script.name for script in SCRIPTS}


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda script: script.name)
def test_the_script_is_shellcheck_clean(script: Path) -> None:
    shellcheck = needs.program("shellcheck", "shellcheck")
    done = subprocess.run([shellcheck, str(script)], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stdout
