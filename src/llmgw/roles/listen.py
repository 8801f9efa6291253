"""Reading `host:port` addresses from configuration."""

from __future__ import annotations

from llmgw.errors import ConfigError


def split_host_port(address: str, key: str) -> tuple[str, int]:
    """("127.0.0.1", 8080) from "127.0.0.1:8080"; "[::1]:8080" for IPv6."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        raise ConfigError(f"'{key}' is {address!r}; expected host:port, such as 127.0.0.1:8080")
    return host.strip("[]") or "0.0.0.0", int(port)
