"""Addresses from configuration, and the sentence for one that cannot be listened on."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path

import pytest

from llmgw import config
from llmgw.config import ServerConfig
from llmgw.errors import ConfigError, LlmgwError
from llmgw.listen import split_host_port
from llmgw.roles.dev import prepare_dev
from llmgw.roles.server import server_role


def test_an_address_without_a_port_is_refused_naming_its_key() -> None:
    with pytest.raises(ConfigError, match=r"'listen' is '127.0.0.1'; expected host:port"):
        split_host_port("127.0.0.1", "listen")


def test_an_ipv6_address_loses_its_brackets() -> None:
    assert split_host_port("[::1]:8080", "listen") == ("::1", 8080)


async def test_a_gateway_port_another_program_holds_is_refused_in_a_sentence(tmp_path: Path) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        taken = f"127.0.0.1:{holder.getsockname()[1]}"
        setup = await asyncio.to_thread(prepare_dev, tmp_path / "dev", ("server",))
        assert setup.server is not None
        cfg: ServerConfig = config.evolve(setup.server, listen=taken, admin_listen="127.0.0.1:0")
        with pytest.raises(BaseException) as caught:
            async with server_role(cfg):
                pass
    errors = caught.value.exceptions if isinstance(caught.value, BaseExceptionGroup) else (caught.value,)
    (error,) = [e for e in errors if isinstance(e, LlmgwError)]
    assert str(error) == (
        f"cannot listen on {taken} (address already in use): another program (or another llmgw) "
        "already listens there; stop it or change 'listen'"
    )
