"""Reading `host:port` addresses from configuration."""

from __future__ import annotations

import errno
import os

from llmgw.errors import ConfigError, LlmgwError


def split_host_port(address: str, key: str) -> tuple[str, int]:
    """("127.0.0.1", 8080) from "127.0.0.1:8080"; "[::1]:8080" for IPv6."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        raise ConfigError(f"'{key}' is {address!r}; expected host:port, such as 127.0.0.1:8080")
    return host.strip("[]") or "0.0.0.0", int(port)


def cannot_listen(address: str, key: str, exc: OSError) -> LlmgwError:
    """The sentence for a listener that could not bind, naming the key that chose the address."""
    reason = os.strerror(exc.errno) if exc.errno else str(exc)
    hint = ""
    if exc.errno == errno.EADDRINUSE:
        hint = ": another program (or another llmgw) already listens there; stop it or change"
    elif exc.errno == errno.EACCES:
        hint = ": ports below 1024 need privileges; use another port or change"
    elif exc.errno == errno.EADDRNOTAVAIL:
        hint = ": this machine has no such address; change"
    else:
        hint = "; check"
    return LlmgwError(f"cannot listen on {address} ({reason.lower()}){hint} '{key}'")
