"""What `server init` asks of the operating system, behind one seam.

Creating a user and driving systemd cannot happen in a test, and the
machine's hostname and addresses decide what a certificate names, so a test
needs them fixed. Everything else init does is files under its root, which a
test can hold in a temporary directory.

The methods block (subprocesses, file lookups): init calls them from a
thread, never from the event loop.
"""

from __future__ import annotations

import ipaddress
import os
import pwd
import shutil
import socket
import subprocess
import sys
from collections.abc import Sequence
from typing import Protocol

import aiohttp
import attrs
import psutil


@attrs.frozen
class Account:
    uid: int
    gid: int


@attrs.frozen
class CommandResult:
    returncode: int
    output: str


class System(Protocol):
    def refusal(self) -> str | None:
        """Why init cannot run here, in a sentence; None when it can."""

    def lookup_user(self, name: str) -> Account | None: ...

    def create_system_user(self, name: str, home: str) -> None:
        """Create a system account that cannot log in; raises InstallError when the OS refuses."""

    def hostname(self) -> str: ...

    def addresses(self) -> Sequence[str]:
        """Every global unicast address of this machine, as text."""

    def has_systemd(self) -> bool: ...

    def systemctl(self, *args: str) -> CommandResult: ...

    async def healthy(self, url: str) -> bool:
        """Whether url answers 200 now."""

    async def registered_nodes(self, admin_url: str) -> int | None:
        """How many nodes the server at admin_url has registered; None when it does not say."""


class InstallError(Exception):
    """A step that cannot be done, in a sentence for the operator."""


def is_global_unicast(address: str) -> bool:
    """An address another machine could dial: not loopback, link-local, multicast or unspecified.

    Private ranges count: a control plane on 10.0.0.0/8 is the usual case,
    and Python's `is_global` would leave exactly those out.
    """
    try:
        ip = ipaddress.ip_address(address.split("%", 1)[0])
    except ValueError:
        return False
    return not (ip.is_loopback or ip.is_link_local or ip.is_multicast or ip.is_unspecified or ip.is_reserved)


@attrs.define
class HostSystem:
    """This machine."""

    def refusal(self) -> str | None:
        if not sys.platform.startswith("linux"):
            return f"llmgw server init sets up a Linux machine with systemd; this one runs {sys.platform}"
        if os.geteuid() != 0:
            return (
                "llmgw server init creates a user, writes /etc/llmgw and starts a service: "
                "run it as root (sudo llmgw server init …)"
            )
        return None

    def lookup_user(self, name: str) -> Account | None:
        try:
            entry = pwd.getpwnam(name)
        except KeyError:
            return None
        return Account(uid=entry.pw_uid, gid=entry.pw_gid)

    def create_system_user(self, name: str, home: str) -> None:
        if shutil.which("useradd") is None:
            raise InstallError(f"there is no useradd on this machine to create the {name} user with")
        done = subprocess.run(
            ["useradd", "--system", "--user-group", "--home-dir", home, "--no-create-home",
             "--shell", "/usr/sbin/nologin", name],
            capture_output=True,
            text=True,
            check=False,
        )  # fmt: skip
        if done.returncode != 0:
            raise InstallError(f"useradd could not create the {name} user: {done.stderr.strip()}")

    def hostname(self) -> str:
        return socket.gethostname()

    def addresses(self) -> Sequence[str]:
        found: list[str] = []
        for entries in psutil.net_if_addrs().values():
            for entry in entries:
                if entry.family in (socket.AF_INET, socket.AF_INET6) and is_global_unicast(entry.address):
                    text = str(ipaddress.ip_address(entry.address.split("%", 1)[0]))
                    if text not in found:
                        found.append(text)
        return found

    def has_systemd(self) -> bool:
        # A container has systemctl installed more often than it has systemd running.
        return shutil.which("systemctl") is not None and os.path.isdir("/run/systemd/system")

    def systemctl(self, *args: str) -> CommandResult:
        done = subprocess.run(
            ["systemctl", *args], capture_output=True, text=True, check=False
        )  # fmt: skip
        return CommandResult(done.returncode, (done.stdout + done.stderr).strip())

    async def healthy(self, url: str) -> bool:
        try:
            async with (
                aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2)) as session,
                session.get(url) as reply,
            ):
                return reply.status == 200
        except (aiohttp.ClientError, TimeoutError):
            return False

    async def registered_nodes(self, admin_url: str) -> int | None:
        # The admin listener asks nothing of a caller on this machine (web/admin_listener.py).
        try:
            async with (
                aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as session,
                session.get(f"{admin_url}/api/v1/nodes") as reply,
            ):
                if reply.status != 200:
                    return None
                nodes = await reply.json()
        except (aiohttp.ClientError, TimeoutError, ValueError):
            return None
        return len(nodes) if isinstance(nodes, list) else None
