"""The addresses a node offers the rest of the fleet: which are its own, and the engines' port range.

A node's engines are reached by the gateway on another host, so the address
they are advertised at must be one of this machine's, and their ports must
come from a range a firewall can name. Both are checked when agent.yaml is
read, because an engine advertised at an address nobody can reach looks ready
and fails every request routed to it.
"""

from __future__ import annotations

import ipaddress

import psutil

# Where engines listen unless agent.yaml says otherwise: above the ports services usually take,
# below Linux's ephemeral range (32768 and up), so a firewall rule for it lets in nothing else.
DEFAULT_ENGINE_PORTS = "20000-20999"
# Listening on every address of the machine: allowed for engine_bind, never advertised.
ANY_ADDRESS = ("0.0.0.0", "::")


def parse_port_range(text: str) -> range:
    """`20000-20999` (or one port, `20000`) as a range of ports; ValueError saying what is wrong."""
    low, dash, high = text.strip().partition("-")
    try:
        first = int(low)
        last = int(high) if dash else first
    except ValueError:
        raise ValueError("expected a range of ports such as 20000-20999") from None
    if not 1 <= first <= last <= 65535:
        raise ValueError("expected a range of ports such as 20000-20999, its first no more than its last")
    return range(first, last + 1)


def port_range_problem(value: object) -> str:
    """Why value is not a port range agent.yaml's `engine_ports` can take; empty when it is one."""
    try:
        parse_port_range(str(value))
    except ValueError as exc:
        return str(exc)
    return ""


def local_addresses() -> set[str]:
    """Every IP address of this machine's interfaces (psutil.net_if_addrs)."""
    found = set()
    for entries in psutil.net_if_addrs().values():
        for entry in entries:
            # An IPv6 link-local address comes with its zone: fe80::1%eth0.
            address = entry.address.partition("%")[0]
            try:
                found.add(str(ipaddress.ip_address(address)))
            except ValueError:
                continue  # a MAC address
    return found


def _own_address_problem(value: object, *, any_allowed: bool) -> str:
    text = str(value)
    if not text or (any_allowed and text in ANY_ADDRESS):
        return ""
    try:
        address = str(ipaddress.ip_address(text.strip("[]")))
    except ValueError:
        return "expected an IP address of this machine"
    own = local_addresses()
    if address not in own:
        listed = ", ".join(sorted(own)) or "none"
        return f"it is not an address of this machine (its addresses: {listed})"
    return ""


def own_address_problem(value: object) -> str:
    """Why value cannot be advertised as this node's address; empty when it can (or is empty)."""
    return _own_address_problem(value, any_allowed=False)


def bind_address_problem(value: object) -> str:
    """Why engines cannot listen on value; empty when they can (0.0.0.0 and :: are every address)."""
    return _own_address_problem(value, any_allowed=True)


def url_host(address: str) -> str:
    """The address as the host of a URL: an IPv6 one in brackets."""
    return f"[{address}]" if ":" in address else address
