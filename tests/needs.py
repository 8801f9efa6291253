"""What a test needs from the machine; a test that lacks it fails, naming the command that provides it.

No test skips for a missing program. A skip is counted apart from the failures and reads as
"fine": `make test` once passed on a fresh machine with the browser, Prometheus and shellcheck
tests skipped, so what they hold was held nowhere. `make test` provides everything here before
the tests start (scripts/install-test-deps.sh, then `make llama-server` and `make test-clients`),
so a test that lacks it is a machine set up by hand, and it fails saying what to run.

The one skip the suite allows is `not_root`: a few tests make network namespaces or mounts,
which a developer's unprivileged `make test` cannot, and CI runs as root (it installs packages).
Any other skip, from pytest.skip or a skipif mark anywhere, is turned into a failure by the
hooks below, which tests/conftest.py installs (with the fixture).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Generator
from pathlib import Path

import pytest

INSTALL = "`make test` installs it, or run scripts/install-test-deps.sh as root"

# Where scripts/build-llama-server.sh keeps the build the tests run, and the build they run.
BUILD_CACHE = Path(os.environ.get("LLMGW_BUILD_CACHE", Path.home() / ".cache" / "llmgw" / "llama-server"))
LLAMA_BUILD = BUILD_CACHE / "11434"
# Where scripts/install-helm.sh puts the helm the chart's tests render with (its helm_version).
HELM_VERSION = "v4.1.4"
HELM_CACHE = Path(os.environ.get("LLMGW_HELM_CACHE", Path.home() / ".cache" / "llmgw" / "helm"))
HELM = HELM_CACHE / HELM_VERSION / "helm"


# Where scripts/install-test-clients.sh installs the command-line agents, and the pins it installs.
CLIENTS_CACHE = Path(os.environ.get("LLMGW_CLIENTS_CACHE", Path.home() / ".cache" / "llmgw" / "clients"))
CLIENTS_PINS = Path(__file__).resolve().parent / "clients" / "package-lock.json"


class NotRoot(pytest.skip.Exception):
    """A test this user cannot run at all: the one skip the suite lets through."""


def program(name: str, package: str) -> str:
    """The path of `name` on PATH; the test fails, naming the package and the command, without it."""
    path = shutil.which(name)
    if path is None:
        pytest.fail(f"{name} is not installed (Debian's {package} package): {INSTALL}", pytrace=False)
    return path


@pytest.fixture(scope="session")
def llama_server() -> Path:
    """The build of scripts/build-llama-server.sh; the test fails, saying how to make it, without it.

    A module that runs it says `pytestmark = pytest.mark.usefixtures("llama_server")`: a session
    fixture, so it is checked before any module fixture starts the server.
    """
    wanted = ["bin/llama-server", "ggml-vocab-llama-spm.gguf"]
    missing = [name for name in wanted if not (LLAMA_BUILD / name).is_file()]
    if not any(LLAMA_BUILD.glob("llama-b*-bin-ubuntu-*.tar.gz.sha256")):
        missing.append("the release archive's digest")
    if missing:
        pytest.fail(
            f"no complete llama-server build in {LLAMA_BUILD} (no {', '.join(missing)}): "
            "`make test` builds it first, or run `make llama-server` (about 10 minutes once)",
            pytrace=False,
        )
    return LLAMA_BUILD


def helm() -> str:
    """The helm of scripts/install-helm.sh; the test fails, saying how to install it, without it.

    Not Debian's (it has none) nor whatever helm is on PATH: the chart is held to the version pinned.
    """
    if not HELM.is_file():
        pytest.fail(
            f"helm {HELM_VERSION} is not installed at {HELM}: `make test` installs it, "
            "or run `make helm` (scripts/install-helm.sh)",
            pytrace=False,
        )
    return str(HELM)


# Where scripts/install-test-deps.sh installs the npm packages the tests run (oidc-provider).
NPM_CACHE = Path(os.environ.get("LLMGW_NPM_CACHE", Path.home() / ".cache" / "llmgw" / "npm"))


def npm_package(name: str) -> Path:
    """The directory of npm package `name` in NPM_CACHE; the test fails without it, naming the command."""
    path = NPM_CACHE / "node_modules" / name
    if not (path / "package.json").is_file():
        pytest.fail(f"the npm package {name} is not in {NPM_CACHE}: {INSTALL}", pytrace=False)
    return path


def client(name: str) -> Path:
    """A command-line agent (claude, codex) at its pinned version; without it the test fails, saying how.

    From the npm registry, as its users install it: scripts/install-test-clients.sh puts the versions
    tests/clients/package-lock.json pins into CLIENTS_CACHE, and a cache holding other versions is
    as good as none.
    """
    path = CLIENTS_CACHE / "node_modules" / ".bin" / name
    installed = CLIENTS_CACHE / "package-lock.json"
    if not path.exists() or not installed.is_file() or installed.read_bytes() != CLIENTS_PINS.read_bytes():
        pins = CLIENTS_PINS.relative_to(CLIENTS_PINS.parents[2])
        pytest.fail(
            f"{name} is not installed in {CLIENTS_CACHE} at the version {pins} "
            "pins: `make test` installs it, or run scripts/install-test-clients.sh (npm, about 250 MB once)",
            pytrace=False,
        )
    return path


def root(what: str) -> None:
    """Skip, the allowed way, when this user is not root: `what` is what the test does that needs it."""
    if os.geteuid() != 0:
        raise NotRoot(f"{what} needs root: run the tests as root (CI does) to run this one")


def _not_allowed(reason: str) -> str:
    return f"a test may not skip ({reason}): give the machine what it needs, see tests/needs.py"


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    excinfo = call.excinfo
    # wasxfail: pytest reports an expected failure as a skip; it is not one.
    if report.skipped and excinfo and not excinfo.errisinstance(NotRoot) and not hasattr(report, "wasxfail"):
        report.outcome = "failed"
        report.longrepr = _not_allowed(str(getattr(excinfo.value, "msg", excinfo.value)))
    return report


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(
    collector: pytest.Collector,
) -> Generator[None, pytest.CollectReport, pytest.CollectReport]:
    """A whole module skipped while it is collected (pytest.importorskip) fails the same way."""
    report = yield
    if report.skipped:
        longrepr = report.longrepr
        reason = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
        report.outcome = "failed"
        report.longrepr = _not_allowed(reason)
    return report
