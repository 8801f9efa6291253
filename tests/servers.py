"""A server role's configuration for tests that run one in their own process."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import attrs

from llmgw import pki
from llmgw.config import ServerConfig, TLSConfig


def loopback_server_config(
    tmp_path: Path, *, hosts: Sequence[str] = ("127.0.0.1",), pki_name: str = "pki", **settings: Any
) -> ServerConfig:
    """Every listener on a free loopback port, an authority and certificate of its own, state under
    tmp_path; settings replace any other key (auth, control, models…)."""
    pki_dir = tmp_path / pki_name
    pki.init_ca(pki_dir)
    pki.issue_server(pki_dir, "server", list(hosts), pki_dir)
    base = ServerConfig(
        listen="127.0.0.1:0",
        admin_listen="127.0.0.1:0",
        agent_listen="127.0.0.1:0",
        state_dir=str(tmp_path / "state"),
        tls=TLSConfig(
            ca=str(pki_dir / "ca.pem"), cert=str(pki_dir / "server.pem"), key=str(pki_dir / "server-key.pem")
        ),
    )
    return attrs.evolve(base, **settings)
