"""A stand-in for the operating system, so that `server init` runs against a temporary root."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import attrs
import pytest

from llmgw.serverinit.controlplane import InitOptions
from llmgw.serverinit.system import Account, CommandResult


@attrs.define
class FakeSystem:
    """A machine called ctl1 at 10.0.0.140 whose users and systemd live in memory.

    Users it creates are the test's own uid and gid, so that init's chown
    calls succeed without root and can still be checked.
    """

    name: str = "ctl1"
    ips: list[str] = attrs.Factory(lambda: ["10.0.0.140"])
    users: dict[str, Account] = attrs.Factory(dict)
    systemd: bool = True
    active: bool = False
    enabled: bool = False
    answers: bool = True
    refuse: str | None = None
    commands: list[tuple[str, ...]] = attrs.Factory(list)
    # What the running server's admin API says of its nodes; None: it does not answer.
    nodes: int | None = None

    def refusal(self) -> str | None:
        return self.refuse

    def lookup_user(self, name: str) -> Account | None:
        return self.users.get(name)

    def create_system_user(self, name: str, home: str) -> None:
        self.commands.append(("useradd", name, home))
        self.users[name] = Account(uid=os.getuid(), gid=os.getgid())

    def hostname(self) -> str:
        return self.name

    def addresses(self) -> Sequence[str]:
        return list(self.ips)

    def has_systemd(self) -> bool:
        return self.systemd

    def systemctl(self, *args: str) -> CommandResult:
        self.commands.append(("systemctl", *args))
        verb = args[0]
        if verb == "is-active":
            return CommandResult(0 if self.active else 3, "")
        if verb == "is-enabled":
            return CommandResult(0 if self.enabled else 1, "")
        if verb == "enable":
            self.enabled = True
            self.active = self.active or "--now" in args
        elif verb in ("start", "restart"):
            self.active = True
        return CommandResult(0, "")

    async def healthy(self, url: str) -> bool:
        return self.answers

    async def registered_nodes(self, admin_url: str) -> int | None:
        self.commands.append(("GET", f"{admin_url}/api/v1/nodes"))
        return self.nodes


@pytest.fixture
def machine() -> FakeSystem:
    return FakeSystem()


@pytest.fixture
def options(tmp_path: Path) -> InitOptions:
    return InitOptions(root=tmp_path / "root", admin="admin@example.com", health_timeout_s=0.2)
