"""Fixtures for whole-fleet tests: hosts made of network namespaces, each role a real `llmgw`.

The hosts (a control plane, two nodes, a mirror host) are made once per session
and removed at its end, even when a test fails or the session is interrupted;
each test starts its own processes on them and has them all stopped, engines
included, when it ends. Without root every test here is skipped (the one skip
tests/needs.py allows); without iproute2, or where root cannot make a namespace
(a container without CAP_NET_ADMIN), every test here fails, saying why.
"""

from __future__ import annotations

import io
from collections.abc import Iterator
from pathlib import Path

import pytest

from .. import needs
from .cluster import Certificates, Fleet
from .netns import Network, remove_leftovers, unavailable, write_log_tail

# The hosts every fleet test has: the last octet of each one's address in 198.18.0.0/24.
HOSTS = {"cp": 1, "n1": 11, "n2": 12, "mh": 21}
# A second address of the control plane that its certificate does not name.
CP_UNNAMED = "198.18.0.2"


@pytest.fixture(scope="session")
def network() -> Iterator[Network]:
    needs.root("making the fleet's hosts out of network namespaces")
    why = unavailable()
    if why:
        pytest.fail(f"the fleet {why}", pytrace=False)
    # Namespaces of an earlier session that crashed before its teardown ran.
    remove_leftovers()
    net = Network()
    try:
        for name, octet in HOSTS.items():
            net.add_host(name, octet)
        net.hosts["cp"].add_address(CP_UNNAMED)
        yield net
    finally:
        net.close()


@pytest.fixture(scope="session")
def certificates(network: Network, tmp_path_factory: pytest.TempPathFactory) -> Certificates:
    """One authority for the session, made with `llmgw cert init-ca`."""
    return Certificates.create(tmp_path_factory.mktemp("pki"))


@pytest.fixture
def fleet(network: Network, certificates: Certificates, tmp_path: Path) -> Iterator[Fleet]:
    """The test's llmgw processes on the session's hosts; all stopped and links restored after it."""
    running = Fleet(network, certificates, tmp_path)
    try:
        yield running
    finally:
        running.stop()
        for host in network.hosts.values():
            host.restore_link()


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    # A failed fleet test shows the end of every llmgw log: the why is usually there.
    report: pytest.TestReport = yield
    running = getattr(item, "funcargs", {}).get("fleet")
    if report.when == "call" and report.failed and isinstance(running, Fleet):
        for process in running.processes():
            out = io.StringIO()
            write_log_tail(process, out)
            report.sections.append((f"llmgw log: {process.name}", out.getvalue()))
    return report
