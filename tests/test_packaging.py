"""What a person cloning llmgw relies on: the Makefile's targets, the README's first lines, CI, the layout."""

from __future__ import annotations

import configparser
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent


def _targets() -> dict[str, str]:
    """Each Makefile target and the line that declares its prerequisites."""
    found = re.findall(r"^([a-z-]+):(.*)$", (ROOT / "Makefile").read_text(), flags=re.MULTILINE)
    return {name: prerequisites for name, prerequisites in found}


@pytest.mark.parametrize("target", ["install", "run", "test", "lint", "typecheck", "proto", "bench", "docs"])
def test_the_makefile_has_the_target(target: str) -> None:
    assert target in _targets()


def test_make_test_runs_the_linter_the_type_checker_and_the_tests() -> None:
    assert set(_targets()["test"].split()) >= {"install", "lint", "typecheck", "pytest"}
    makefile = (ROOT / "Makefile").read_text()
    assert "ruff check" in makefile and "mypy" in makefile


def test_make_run_starts_the_dev_system_and_ci_runs_make_test() -> None:
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"^run:.*\n\t.*llmgw --role=server --role=agent --dev\s*$", makefile, re.MULTILINE)
    ci = (ROOT / ".ci/run").read_text().splitlines()
    assert ci[-1] == "make test"


def test_make_test_and_ci_install_the_packages_the_tests_need_before_anything_else() -> None:
    """Before the virtual environment too: Debian's python3 makes none without python3-venv."""
    assert _targets()["test"].split()[0] == "test-deps"
    assert "\tPYTHON=$(PYTHON) scripts/install-test-deps.sh" in (ROOT / "Makefile").read_text()
    ci = (ROOT / ".ci/run").read_text().splitlines()
    assert ci.index("scripts/install-test-deps.sh") < ci.index("make test")


def test_the_tests_run_after_llama_server_is_built_and_the_command_line_clients_installed() -> None:
    """tests/needs.py fails a test whose program is missing: `make test` provides each first."""
    assert set(_targets()["pytest"].split()) >= {"llama-server", "test-clients"}
    assert "\tscripts/install-test-clients.sh" in (ROOT / "Makefile").read_text()


def test_make_test_fails_when_pytest_collects_no_test(tmp_path: Path) -> None:
    """pytest's exit status 5 (no tests collected) fails `make test`, and so .ci/run (set -e)."""
    (tmp_path / "pytest").write_text("#!/bin/sh\nexit 5\n")
    (tmp_path / "pytest").chmod(0o755)
    done = subprocess.run(
        [
            *("make", "--no-print-directory", "-o", "install", "-o", "llama-server", "-o", "test-clients"),
            *("pytest", f"BIN={tmp_path}"),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode != 0
    assert "Error 5" in done.stderr


def test_the_readme_opens_with_make_run_and_make_test() -> None:
    lines = [line for line in (ROOT / "README.md").read_text().splitlines() if line.strip()]
    commands = [line.split("#")[0].strip() for line in lines[1:5] if line.startswith("make ")]
    assert commands == ["make run", "make test"]


def test_setup_cfg_pins_a_range_for_every_dependency_and_installs_the_llmgw_command() -> None:
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    requires = [r for r in cfg["options"]["install_requires"].splitlines() if r.strip()]
    assert requires and all(re.search(r"(==|>=)", r) for r in requires), requires
    assert "llmgw = llmgw.cli.main:main" in cfg["options.entry_points"]["console_scripts"]


@pytest.mark.parametrize(
    "path",
    [
        "src/llmgw/roles",
        "src/llmgw/engines",
        "protos/llmgw/v1/agent.proto",
        "systemd",
        "scripts",
        "CHANGELOG.md",
        "docs/architecture.md",
        "docs/reference.md",
    ],
)
def test_the_layout_of_the_design_card_is_there(path: str) -> None:
    assert (ROOT / path).exists()


def test_python_dash_m_llmgw_and_the_console_script_are_the_same_program() -> None:
    by_module = subprocess.run(
        [sys.executable, "-m", "llmgw", "--version"], capture_output=True, text=True, check=True
    )
    script = Path(sys.executable).parent / "llmgw"
    by_script = subprocess.run([str(script), "--version"], capture_output=True, text=True, check=True)
    assert by_module.stdout == by_script.stdout != ""


def test_the_wheel_install_md_builds_carries_the_pages_units_and_protocol(tmp_path: Path) -> None:
    """docs/install.md installs llmgw from a wheel built from the checkout; it must be whole."""
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--quiet",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(tmp_path),
            str(ROOT),
        ],
        check=True,
        capture_output=True,
    )
    (wheel,) = tmp_path.glob("llmgw-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for expected in (
        "llmgw/web/templates/base.html",
        "llmgw/web/static/llmgw.css",
        "llmgw/serverinit/files/llmgw-server.service",
        "llmgw/serverinit/files/server.yaml",
        "llmgw/serverinit/files/mirror.yaml",
        "llmgw/proto/llmgw/v1/__init__.py",
        "llmgw/py.typed",
    ):
        assert expected in names, f"the wheel lacks {expected}"


def test_the_readme_links_every_page_of_the_docs() -> None:
    """A page the README does not link is one a newcomer never finds (it once listed 7 of 15)."""
    readme = (ROOT / "README.md").read_text()
    unlinked = [p.name for p in sorted((ROOT / "docs").glob("*.md")) if f"](docs/{p.name})" not in readme]
    assert unlinked == [], f"README.md links none of: {unlinked}"
