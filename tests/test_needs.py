"""No test skips for what the machine lacks: a skip fails, naming what to run, unless the user is not root."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests import needs

ROOT = Path(__file__).parent.parent


def _run(pytester: pytest.Pytester, source: str) -> pytest.RunResult:
    pytester.makeini("[pytest]\nasyncio_default_fixture_loop_scope = function\n")
    pytester.makeconftest("from tests.needs import pytest_make_collect_report, pytest_runtest_makereport")
    pytester.makepyfile(test_it=source)
    return pytester.runpytest_inprocess("-p", "no:cacheprovider", "-rA")


def test_a_skip_for_a_missing_program_fails_with_its_reason(pytester: pytest.Pytester) -> None:
    result = _run(
        pytester,
        """
import pytest

from tests import needs

def test_it():
    pytest.skip("promtool is not installed")
""",
    )
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*a test may not skip (promtool is not installed)*"])


def test_a_skipif_mark_fails_the_run_too(pytester: pytest.Pytester) -> None:
    result = _run(
        pytester,
        """
import pytest

from tests import needs

@pytest.mark.skipif(True, reason="needs chromium")
def test_it():
    pass
""",
    )
    # Marks are read as the test is set up: a failure there is counted as an error.
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*a test may not skip (needs chromium)*"])


def test_a_module_that_skips_while_it_is_collected_fails(pytester: pytest.Pytester) -> None:
    result = _run(
        pytester,
        """
import pytest

from tests import needs

pytest.importorskip("surely_no_such_module_here")

def test_it():
    pass
""",
    )
    assert result.ret != 0
    result.stdout.fnmatch_lines(["*a test may not skip*surely_no_such_module_here*"])


def test_a_test_that_needs_root_is_skipped_for_another_user(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The one allowed skip: a developer's unprivileged `make test` cannot make namespaces or mounts."""
    monkeypatch.setattr("os.geteuid", lambda: 1000)
    result = _run(
        pytester,
        """
from tests import needs

def test_it():
    needs.root("mounting a tmpfs")
""",
    )
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(["*mounting a tmpfs needs root*"])


def test_a_missing_program_fails_naming_its_package_and_the_command_that_installs_it(
    pytester: pytest.Pytester,
) -> None:
    result = _run(
        pytester,
        """
from tests import needs

def test_it():
    needs.program("surely-no-such-program-here", "nosuch")
""",
    )
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        ["*surely-no-such-program-here is not installed (Debian's nosuch package): `make test` installs it*"]
    )


def test_no_test_skips_but_through_needs_root() -> None:
    """A new skip is caught when it is written, not when a fresh machine quietly passes without it."""
    skips = re.compile(r"pytest\.skip\(|\.skipif\(|importorskip\(|mark\.skip\b|NotRoot\(")
    found = [
        f"{path.relative_to(ROOT)}:{number}"
        for path in sorted((ROOT / "tests").rglob("*.py"))
        if path.name not in ("needs.py", "test_needs.py")
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if skips.search(line)
    ]
    assert found == [], "skip through needs.root (for root only) or fail: see tests/needs.py"


class TestClients:
    """The command-line agents come from scripts/install-test-clients.sh, at the versions pinned."""

    def _cache(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, lock: bytes | None) -> Path:
        monkeypatch.setattr(needs, "CLIENTS_CACHE", tmp_path)
        bin = tmp_path / "node_modules" / ".bin"
        bin.mkdir(parents=True)
        (bin / "claude").write_text("#!/bin/sh\n")
        if lock is not None:
            (tmp_path / "package-lock.json").write_bytes(lock)
        return bin / "claude"

    def test_one_installed_at_the_pinned_versions_is_found(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        claude = self._cache(tmp_path, monkeypatch, needs.CLIENTS_PINS.read_bytes())
        assert needs.client("claude") == claude

    def test_a_missing_one_fails_naming_the_script_that_installs_it(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        self._cache(tmp_path, monkeypatch, needs.CLIENTS_PINS.read_bytes())
        with pytest.raises(pytest.fail.Exception, match=r"codex is not installed .*install-test-clients\.sh"):
            needs.client("codex")

    def test_one_installed_at_other_versions_fails_as_if_missing(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        self._cache(tmp_path, monkeypatch, b'{"lockfileVersion": 3, "packages": {}}')
        with pytest.raises(pytest.fail.Exception, match=r"claude is not installed .* at the version"):
            needs.client("claude")
