"""Which port an engine listens on: a free one of agent.yaml's `engine_ports`, and whether one is taken.

The agent chooses the port before the engine starts, so two shards on one node
are never handed the same one; the engine binds it a moment later.
"""

from __future__ import annotations

import errno
import random
import socket

from llmgw.errors import LlmgwError


class NoFreePort(LlmgwError):
    """Every port of engine_ports is taken on the bind address."""


def free_port(host: str, ports: range, taken: set[int]) -> int:
    """A port of ports nothing listens on now on host, nor handed to another shard here.

    The engine binds it a moment later; another process could take it in between, and
    then the engine fails to start and is reported.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # From a random place in the range: an engine restarted at once does not retry the port
    # its predecessor may still hold in TIME_WAIT, and two agents on one host rarely collide.
    start = random.randrange(len(ports))
    last_error = ""
    for i in range(len(ports)):
        port = ports[(start + i) % len(ports)]
        if port in taken:
            continue
        with socket.socket(family, socket.SOCK_STREAM) as s:
            try:
                s.bind((host, port))
            except OSError as exc:
                last_error = exc.strerror or str(exc)
                continue
            return port
    span = f"{ports.start}-{ports.stop - 1}"
    why = f"all {len(ports)} are taken" + (f" (the last said: {last_error})" if last_error else "")
    raise NoFreePort(f"no free port in engine_ports {span} on {host}: {why}")


def port_taken(host: str, port: int) -> bool:
    """Whether something listens on host:port now (blocking: run in a thread)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        # A connection the exited engine left in TIME_WAIT does not count as the port in use.
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as exc:
            # Only "in use": an address that is not this machine's is another failure, not this one.
            return exc.errno == errno.EADDRINUSE
    return False


def on_this_machine(bind: str) -> str:
    """The address that reaches an engine listening on bind from this machine: loopback for a wildcard."""
    return {"0.0.0.0": "127.0.0.1", "::": "::1"}.get(bind, bind)
