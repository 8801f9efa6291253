"""Hosts made of network namespaces, for tests and benchmarks that need several machines.

A `Network` is one switch namespace holding a bridge, and one namespace per host
with `lo` and one veth (`eth0`) plugged into that bridge, addressed in
198.18.0.0/24 (inside 198.18.0.0/15, the range reserved for network tests). The
root namespace is never changed: deleting the namespaces removes every link.
Only addresses made here, and loopback, are ever dialled.

Names are short and carry the pid of the process that made them (`lg1234-sw`,
`lg1234-cp`), so a later run can tell a crashed run's leftovers (its pid is gone)
from a run still going on beside it, and remove only the former.

Needs root (CAP_NET_ADMIN and CAP_SYS_ADMIN) and iproute2's `ip`; `unavailable()`
says in words why not when either is missing.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import re
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import IO, TypeVar

import attrs
import psutil

SUBNET = "198.18.0"
PREFIX_LENGTH = 24
# Inside 198.18.0.0/15 but outside every host's /24, and no host has a default route:
# dialling it fails at once with "Network is unreachable".
UNROUTED = "198.19.255.1"

_NAME = re.compile(r"^lg(?P<pid>\d+)-[a-z0-9]+$")
_CLONE_NEWNET = 0x40000000
_T = TypeVar("_T")


class NetnsError(Exception):
    """An `ip` command failed; the message carries what it printed."""


def _ip(*args: str, check: bool = True) -> str:
    done = subprocess.run(["ip", *args], capture_output=True, text=True, check=False)
    if check and done.returncode != 0:
        raise NetnsError(f"ip {' '.join(args)}: {done.stderr.strip() or done.returncode}")
    return done.stdout


def unavailable() -> str | None:
    """Why namespaces cannot be made here, in words; None when they can."""
    if shutil.which("ip") is None:
        return "needs iproute2's `ip` to make network namespaces (scripts/install-test-deps.sh installs it)"
    if os.geteuid() != 0:
        return "needs root (CAP_NET_ADMIN) to make network namespaces"
    probe = f"lg{os.getpid()}-probe"
    try:
        _ip("netns", "add", probe)
    except NetnsError as exc:
        return f"cannot make a network namespace here (needs CAP_NET_ADMIN and CAP_SYS_ADMIN): {exc}"
    _ip("netns", "del", probe, check=False)
    return None


def _namespace_pids(netns: str) -> list[int]:
    return [int(p) for p in _ip("netns", "pids", netns, check=False).split()]


def _kill_namespace(netns: str, grace_s: float = 5.0) -> None:
    """End every process inside netns (SIGTERM, then SIGKILL after grace_s) and delete it."""
    pids = _namespace_pids(netns)
    procs = []
    for pid in pids:
        with contextlib.suppress(psutil.Error):
            proc = psutil.Process(pid)
            proc.terminate()
            procs.append(proc)
    _, alive = psutil.wait_procs(procs, timeout=grace_s)
    for proc in alive:
        with contextlib.suppress(psutil.Error):
            proc.kill()
    psutil.wait_procs(alive, timeout=grace_s)
    _ip("netns", "del", netns, check=False)


def remove_leftovers() -> list[str]:
    """Delete the namespaces of earlier runs whose process is gone; the names removed."""
    removed = []
    for line in _ip("netns", "list", check=False).splitlines():
        name = line.split(" ", 1)[0]
        match = _NAME.match(name)
        if match is None or psutil.pid_exists(int(match["pid"])):
            continue
        _kill_namespace(name, grace_s=1.0)
        removed.append(name)
    return removed


# The namespace the current thread was moved into by _enter; absent on threads never moved.
_here = threading.local()


def _enter(netns: str) -> None:
    """Move the calling thread (only it) into netns: sockets it opens then live there."""
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(f"/run/netns/{netns}", os.O_RDONLY)
    try:
        if libc.setns(fd, _CLONE_NEWNET) != 0:
            errno = ctypes.get_errno()
            raise OSError(errno, f"setns into {netns}: {os.strerror(errno)}")
    finally:
        os.close(fd)
    _here.netns = netns


@attrs.define
class Process:
    """A process started inside a host's namespace, leading its own process group."""

    name: str
    popen: subprocess.Popen[bytes]
    log: Path

    @property
    def pid(self) -> int:
        return self.popen.pid

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def alive(self) -> bool:
        return self.popen.poll() is None

    def signal_group(self, sig: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.popen.pid, sig)

    def stop(self, timeout_s: float = 10.0) -> int:
        """SIGTERM to the group, SIGKILL after timeout_s; the exit status."""
        if self.alive():
            self.signal_group(signal.SIGTERM)
            try:
                return self.popen.wait(timeout_s)
            except subprocess.TimeoutExpired:
                pass
        self.signal_group(signal.SIGKILL)
        return self.popen.wait(timeout_s)


@attrs.define(eq=False)
class Host:
    """One machine: a namespace with lo and eth0 (address on the switch's bridge)."""

    name: str
    netns: str
    address: str
    switch: str
    processes: list[Process] = attrs.Factory(list)
    _thread: ThreadPoolExecutor | None = None

    def run(
        self,
        argv: Sequence[str],
        log: Path,
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
        name: str = "",
    ) -> Process:
        """Start argv inside this host, output to log, in a new session (its own process group)."""
        log.parent.mkdir(parents=True, exist_ok=True)
        with log.open("ab") as sink:
            popen = subprocess.Popen(
                ["ip", "netns", "exec", self.netns, *argv],
                stdin=subprocess.DEVNULL,
                stdout=sink,
                stderr=subprocess.STDOUT,
                env=dict(env) if env is not None else None,
                cwd=cwd,
                start_new_session=True,
            )
        process = Process(name=f"{self.name}:{name or Path(argv[0]).name}", popen=popen, log=log)
        self.processes.append(process)
        return process

    def exec(self, argv: Sequence[str], env: Mapping[str, str] | None = None, timeout_s: float = 30.0) -> str:
        """Run argv inside this host to the end; its stdout (stderr joins it on failure, raised)."""
        done = subprocess.run(
            ["ip", "netns", "exec", self.netns, *argv],
            capture_output=True,
            text=True,
            env=dict(env) if env is not None else None,
            timeout=timeout_s,
            check=False,
        )
        if done.returncode != 0:
            raise NetnsError(f"{' '.join(argv)} on {self.name} exited {done.returncode}: {done.stderr}")
        return done.stdout

    def call(self, fn: Callable[..., _T], *args: object, **kwargs: object) -> _T:
        """fn(*args, **kwargs) on a thread that lives in this host: its sockets are this host's."""
        if getattr(_here, "netns", None) == self.netns:
            # Already on this host's thread: waiting for it to run fn would wait forever.
            return fn(*args, **kwargs)
        if self._thread is None:
            self._thread = ThreadPoolExecutor(1, self.name, initializer=_enter, initargs=(self.netns,))
        return self._thread.submit(fn, *args, **kwargs).result()

    def call_here(self, fn: Callable[[], _T]) -> _T:
        """fn() on the calling thread, moved into this host for good: for a thread of its own."""
        _enter(self.netns)
        return fn()

    def add_address(self, address: str) -> None:
        _ip("-n", self.netns, "addr", "add", f"{address}/{PREFIX_LENGTH}", "dev", "eth0")

    def cut_link(self) -> None:
        """Unplug this host's cable at the switch: nothing reaches it and it reaches nothing."""
        _ip("-n", self.switch, "link", "set", self.name, "down")

    def restore_link(self) -> None:
        _ip("-n", self.switch, "link", "set", self.name, "up")

    def listening_ports(self) -> list[tuple[str, int]]:
        """(address, port) of every TCP socket listening inside this host."""
        found = []
        for line in _ip("netns", "exec", self.netns, "ss", "-Hltn").splitlines():
            local = line.split()[3]
            address, _, port = local.rpartition(":")
            found.append((address.strip("[]"), int(port)))
        return found

    def stop_processes(self) -> None:
        """Stop what run() started, newest first, then anything else left inside the namespace."""
        for process in reversed(self.processes):
            process.stop()
        self.processes.clear()
        pids = _namespace_pids(self.netns)
        procs = []
        for pid in pids:
            with contextlib.suppress(psutil.Error):
                proc = psutil.Process(pid)
                proc.kill()
                procs.append(proc)
        psutil.wait_procs(procs, timeout=10)

    def close(self) -> None:
        if self._thread is not None:
            self._thread.shutdown(wait=True)
            self._thread = None
        self.stop_processes()
        _kill_namespace(self.netns)


class Network:
    """A switch namespace with a bridge, and hosts plugged into it; close() removes it all."""

    def __init__(self, prefix: str | None = None) -> None:
        self.prefix = prefix or f"lg{os.getpid()}"
        self.switch = f"{self.prefix}-sw"
        self.hosts: dict[str, Host] = {}
        self._closers = contextlib.ExitStack()
        _ip("netns", "add", self.switch)
        self._closers.callback(_kill_namespace, self.switch)
        try:
            _ip("-n", self.switch, "link", "set", "lo", "up")
            _ip("-n", self.switch, "link", "add", "br0", "type", "bridge")
            _ip("-n", self.switch, "link", "set", "br0", "up")
        except BaseException:
            self.close()
            raise

    def add_host(self, name: str, octet: int) -> Host:
        """Host `name` at 198.18.0.<octet>; its cable is the switch's port called `name`."""
        netns = f"{self.prefix}-{name}"
        _ip("netns", "add", netns)
        host = Host(name=name, netns=netns, address=f"{SUBNET}.{octet}", switch=self.switch)
        self._closers.callback(host.close)
        self.hosts[name] = host
        _ip("-n", netns, "link", "set", "lo", "up")
        _ip("-n", self.switch, "link", "add", name, "type", "veth", "peer", "name", "eth0", "netns", netns)
        _ip("-n", self.switch, "link", "set", name, "master", "br0", "up")
        host.add_address(host.address)
        _ip("-n", netns, "link", "set", "eth0", "up")
        return host

    def remove_host(self, name: str) -> None:
        """Stop host `name`'s processes and delete its namespace (its cable goes with it)."""
        self.hosts.pop(name).close()

    def close(self) -> None:
        """Stop every host's processes and delete the namespaces, newest first."""
        self._closers.close()


def wait_until(predicate: Callable[[], _T], timeout_s: float, what: str, every_s: float = 0.2) -> _T:
    """predicate()'s first true answer within timeout_s; otherwise fail naming what was awaited."""
    deadline = time.monotonic() + timeout_s
    last: _T = predicate()
    while not last:
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:g} s waiting for {what}")
        time.sleep(every_s)
        last = predicate()
    return last


def write_log_tail(process: Process, out: IO[str], lines: int = 40) -> None:
    tail = process.output().splitlines()[-lines:]
    out.write(f"--- {process.name} ({process.log}) ---\n" + "\n".join(tail) + "\n")
