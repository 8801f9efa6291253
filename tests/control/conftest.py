"""Certificates from llmgw's own CA, and a configuration that serves agents on a loopback port."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import attrs
import pytest

from llmgw import pki
from llmgw.config import ControlConfig, ServerConfig, TLSConfig

from .. import waiting

Eventually = Callable[[Callable[[], object]], Awaitable[None]]


@attrs.frozen
class Fleet:
    """One authority with a server certificate and agent certificates for n1 and n2, plus a stranger's."""

    server: TLSConfig
    agents: dict[str, TLSConfig]
    # n1's certificate, signed by an authority the server has never heard of.
    stranger: TLSConfig


@pytest.fixture(scope="session")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Fleet:
    root = tmp_path_factory.mktemp("pki")
    ca, other = root / "ca", root / "other-ca"
    pki.init_ca(ca)
    pki.init_ca(other)
    cert, key = pki.issue_server(ca, "control", ["127.0.0.1", "localhost"], root / "server")
    agents = {}
    for node in ("n1", "n2"):
        node_cert, node_key = pki.issue_agent(ca, node, root / "agents")
        agents[node] = TLSConfig(ca=str(ca / "ca.pem"), cert=str(node_cert), key=str(node_key))
    s_cert, s_key = pki.issue_agent(other, "n1", root / "stranger")
    return Fleet(
        server=TLSConfig(ca=str(ca / "ca.pem"), cert=str(cert), key=str(key)),
        agents=agents,
        stranger=TLSConfig(ca=str(ca / "ca.pem"), cert=str(s_cert), key=str(s_key)),
    )


@pytest.fixture
def server_cfg(fleet: Fleet) -> ServerConfig:
    return ServerConfig(
        agent_listen="127.0.0.1:0",
        tls=fleet.server,
        control=ControlConfig(interval_s=0.05, grace_s=5.0, base_backoff_s=0.2),
    )


@pytest.fixture
def eventually() -> Eventually:
    """Wait until predicate() is true, polling, for at most five seconds."""

    async def wait(predicate: Callable[[], object], within_s: float = 5.0) -> None:
        await waiting.eventually(predicate, within_s)

    return wait
