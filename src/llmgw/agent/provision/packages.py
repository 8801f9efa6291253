"""OS packages an engine build needs, installed with the machine's own tool.

Only the missing ones, from the node's own package sources: a package the
system already has is never touched, so installing an engine never upgrades
something the rest of the machine depends on.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence

import attrs

from llmgw.agent.discovery.host import Host
from llmgw.agent.provision.runner import CommandResult, CommandRunner
from llmgw.errors import LlmgwError

# What a package command prints when it failed only because another holds
# the lock: apt's "Could not get lock" / "Unable to lock directory", dnf's and
# yum's waits on another process, zypper's "System management is locked".
_LOCK_HELD = (
    "unable to lock",
    "could not get lock",
    "is locked by another process",
    "waiting for process with pid",
    "another app is currently holding the yum lock",
    "system management is locked",
)

# apt's own wait for dpkg's lock. It does not cover the lock `apt-get update`
# takes on its lists, which is why a held lock is also retried here.
_APT_LOCK_TIMEOUT = "DPkg::Lock::Timeout=600"

# A package command that runs this long is stuck, not slow.
_COMMAND_TIMEOUT_S = 1800.0


class PackageError(LlmgwError):
    """OS packages a build needs that could not be installed."""


@attrs.frozen
class _Plan:
    tool: str
    commands: tuple[tuple[str, ...], ...]
    env: Mapping[str, str] = attrs.field(factory=dict)


async def ensure_packages(
    runner: CommandRunner,
    host: Host,
    by_family: Mapping[str, Sequence[str]],
    progress: Callable[[str], None],
    *,
    lock_retry_s: float = 10.0,
    lock_wait_s: float = 600.0,
) -> None:
    """Install whichever of this family's packages are missing, or raise PackageError.

    A system of no family known here is not refused: its packages may well be
    there, and if they are not, ldd names the library that is missing.
    """
    family = host.family
    wanted = list(by_family.get(family, ()))
    if not wanted:
        return
    missing = [p for p in wanted if not await _installed(runner, family, p)]
    if not missing:
        return
    plan = await _plan(runner, family, missing)
    names = ", ".join(missing)
    if plan is None:
        raise PackageError(f"{names} is missing and this machine has no package manager to install it with")
    progress(f"installing {names} with {plan.tool}")
    for argv in plan.commands:
        await _run_waiting_for_lock(runner, plan, argv, progress, lock_retry_s, lock_wait_s)
    still = [p for p in missing if not await _installed(runner, family, p)]
    if still:
        raise PackageError(f"{plan.tool} finished but {', '.join(still)} is still not installed")


async def _installed(runner: CommandRunner, family: str, package: str) -> bool:
    if family == "deb":
        # dpkg-query answers for a package merely known about, too; the status
        # abbreviation is "ii " only when it is installed.
        res = await runner.run(["dpkg-query", "-W", "-f=${db:Status-Abbrev}", package])
        return res.ok and res.output.startswith("ii")
    res = await runner.run(["rpm", "-q", package])
    return res.ok


async def _plan(runner: CommandRunner, family: str, packages: list[str]) -> _Plan | None:
    if family == "deb":
        if await runner.which("apt-get") is None:
            return None
        lock = ("-o", _APT_LOCK_TIMEOUT)
        return _Plan(
            tool="apt-get",
            commands=(
                ("apt-get", *lock, "update"),
                ("apt-get", *lock, "install", "-y", "--no-install-recommends", *packages),
            ),
            env={"DEBIAN_FRONTEND": "noninteractive"},
        )
    for tool in ("dnf", "yum"):
        if await runner.which(tool) is not None:
            return _Plan(tool=tool, commands=((tool, "install", "-y", *packages),))
    if await runner.which("zypper") is not None:
        return _Plan(tool="zypper", commands=(("zypper", "--non-interactive", "install", *packages),))
    return None


def lock_held(output: str) -> bool:
    """Whether a package command failed only because another held the lock."""
    text = output.lower()
    return any(s in text for s in _LOCK_HELD)


async def _run_waiting_for_lock(
    runner: CommandRunner,
    plan: _Plan,
    argv: tuple[str, ...],
    progress: Callable[[str], None],
    retry_s: float,
    wait_s: float,
) -> None:
    # A machine a minute old runs cloud-init's and unattended-upgrades' own apt,
    # and the first install on a new node failed on "Unable to lock directory
    # /var/lib/apt/lists/". Waiting for it is not a failure; ten minutes of it is.
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait_s
    while True:
        res = await runner.run(argv, env=plan.env or None, timeout_s=_COMMAND_TIMEOUT_S)
        if res.ok:
            return
        if not lock_held(res.output) or loop.time() >= deadline:
            raise PackageError(_failed(argv, res))
        progress(f"waiting for another {plan.tool} to finish (a new machine runs its own updates first)")
        await asyncio.sleep(retry_s)


def _failed(argv: Sequence[str], res: CommandResult) -> str:
    how = "did not finish in time" if res.timed_out else f"exited {res.returncode}"
    last = res.last_line()
    return f"`{' '.join(argv)}` {how}" + (f": {last}" if last else "")
