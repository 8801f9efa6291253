"""scripts/install-test-clients.sh: Claude Code and Codex CLI at their pinned versions, into a cache.

Run with a stand-in `npm` that writes down how it was called and installs two programs that
answer --version as the pinned ones do (or as others do); the rest of PATH is the machine's.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import attrs
import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "install-test-clients.sh"
PINS = ROOT / "tests" / "clients"
# What the script runs besides npm, and the stand-in npm runs.
TOOLS = ("bash", "node", "cmp", "grep", "mkdir", "cp", "dirname", "chmod")


def _pin(package: str) -> str:
    version: str = json.loads((PINS / "package.json").read_text())["dependencies"][package]
    return version


@attrs.frozen
class Machine:
    bin: Path
    cache: Path
    calls: Path

    def run(self) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(self.bin / "bash"), str(SCRIPT)],
            env={"PATH": str(self.bin), "LLMGW_CLIENTS_CACHE": str(self.cache)},
            capture_output=True,
            text=True,
            check=False,
        )

    def npm_calls(self) -> list[str]:
        return self.calls.read_text().splitlines() if self.calls.exists() else []


def _npm(calls: Path, claude: str, codex: str) -> str:
    """A stand-in npm: `npm ci --prefix DIR` puts claude and codex, answering --version so, in DIR."""
    return f"""#!/bin/sh
echo "$*" >> {calls}
prefix="$3"
mkdir -p "$prefix/node_modules/.bin"
printf '#!/bin/sh\\necho "{claude}"\\n' > "$prefix/node_modules/.bin/claude"
printf '#!/bin/sh\\necho "{codex}"\\n' > "$prefix/node_modules/.bin/codex"
chmod +x "$prefix/node_modules/.bin/claude" "$prefix/node_modules/.bin/codex"
"""


@pytest.fixture
def machine(tmp_path: Path) -> Machine:
    """A machine with node and an npm that installs the pinned versions."""
    bin = tmp_path / "bin"
    bin.mkdir()
    for tool in TOOLS:
        found = shutil.which(tool)
        assert found, f"{tool} is not on PATH"
        os.symlink(found, bin / tool)
    calls = tmp_path / "npm.calls"
    npm = bin / "npm"
    claude, codex = _pin("@anthropic-ai/claude-code"), _pin("@openai/codex")
    npm.write_text(_npm(calls, f"{claude} (Claude Code)", f"codex-cli {codex}"))
    npm.chmod(0o755)
    return Machine(bin, tmp_path / "cache" / "llmgw" / "clients", calls)


def test_it_installs_the_pinned_lock_file_with_npm_ci_into_the_cache(machine: Machine) -> None:
    done = machine.run()
    assert done.returncode == 0, done.stderr
    assert machine.npm_calls() == [f"ci --prefix {machine.cache} --no-audit --no-fund --loglevel=error"]
    for name in ("package.json", "package-lock.json"):
        assert (machine.cache / name).read_bytes() == (PINS / name).read_bytes()
    assert f"installing Claude Code {_pin('@anthropic-ai/claude-code')}" in done.stderr


def test_with_the_pinned_versions_installed_it_does_nothing(machine: Machine) -> None:
    assert machine.run().returncode == 0
    done = machine.run()
    assert (done.returncode, done.stdout, done.stderr) == (0, "", "")
    assert len(machine.npm_calls()) == 1


def test_a_cache_of_other_versions_is_installed_again(machine: Machine) -> None:
    assert machine.run().returncode == 0
    (machine.cache / "package-lock.json").write_text("{}")
    assert machine.run().returncode == 0
    assert len(machine.npm_calls()) == 2


def test_programs_that_do_not_answer_with_the_pinned_version_fail_the_install(machine: Machine) -> None:
    """What a registry or npm that installed something else, or ran no postinstall, leaves behind."""
    (machine.bin / "npm").write_text(_npm(machine.calls, "placeholder", "codex-cli 0.0.1"))
    done = machine.run()
    assert done.returncode == 1
    assert "does not answer with the pinned version" in done.stderr


def test_without_npm_it_names_the_script_that_installs_it(machine: Machine) -> None:
    (machine.bin / "npm").unlink()
    done = machine.run()
    assert done.returncode == 1
    assert done.stderr == (
        "install-test-clients: npm is not installed (Debian's nodejs and npm packages): "
        "run scripts/install-test-deps.sh as root\n"
    )
