"""A throwaway PostgreSQL cluster for the tests: Debian's server, started as an unprivileged user.

The cluster lives in a temporary directory, listens on loopback on a free port (and on any other
address a test asks for: an address of a network namespace's bridge the test made), trusts every
local connection, and is stopped and removed at the end of the session even when a test fails.
Given a `wrap` prefix (`ip netns exec NS`), every command of the cluster, psql included, runs
inside that namespace: the server is then a host of its own on the test's network.
Each test gets a database of its own (`fresh_database`), so no test sees another's rows.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import attrs

from . import needs

# The role every test connects as; trust authentication, so no password anywhere.
USER = "llmgw"


def server_binaries() -> Path | None:
    """The directory of initdb and pg_ctl: Debian keeps them per version, off PATH."""
    for bindir in sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=_version, reverse=True):
        if Path(bindir, "initdb").exists() and Path(bindir, "pg_ctl").exists():
            return Path(bindir)
    initdb = shutil.which("initdb")
    if initdb and shutil.which("pg_ctl"):
        return Path(initdb).parent
    return None


def unavailable() -> str | None:
    """Why no cluster can be made here, or None."""
    if server_binaries() is None:
        return f"the PostgreSQL server is not installed (Debian's postgresql package): {needs.INSTALL}"
    return None


def _version(bindir: str) -> int:
    try:
        return int(Path(bindir).parent.name.split(".")[0])
    except ValueError:
        return 0


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@attrs.define
class Cluster:
    """A running throwaway cluster."""

    directory: Path
    port: int
    bindir: Path
    _run_as: str | None
    # The address psql dials and url() names by default: the first the cluster listens on.
    host: str = "127.0.0.1"
    # Put before every command, so it runs where the cluster lives (e.g. `ip netns exec NS`).
    wrap: tuple[str, ...] = ()
    _databases: int = 0

    def url(self, database: str = "postgres", host: str | None = None) -> str:
        return f"postgresql://{USER}@{host or self.host}:{self.port}/{database}"

    def fresh_database(self) -> str:
        """A new empty database; its URL."""
        self._databases += 1
        name = f"t{os.getpid()}_{self._databases}"
        self.psql(f"CREATE DATABASE {name}")
        return self.url(name)

    def psql(self, sql: str, database: str = "postgres") -> str:
        """Run one statement with psql; its output without headers."""
        psql = self.bindir / "psql"
        command = [*self.wrap, str(psql) if psql.exists() else "psql"]
        command += ["-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1", "-h", self.host]
        command += ["-p", str(self.port), "-U", USER, "-d", database, "-c", sql]
        done = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"psql {sql!r} failed: {done.stderr.strip()}")
        return done.stdout.strip()

    def stop(self, mode: str = "fast") -> None:
        if mode == "immediate":
            # This cluster runs with synchronous_commit off (speed): a commit it acknowledged may still
            # be in its WAL buffers, and a crash would lose it, as a PostgreSQL set up for durability
            # never does. Out to the operating system first, so that what is tested is llmgw's loss alone
            # (a stored usage batch vanished at an outage, and read as llmgw losing it).
            with contextlib.suppress(RuntimeError, subprocess.TimeoutExpired):
                self.psql("CHECKPOINT")
        self._as_owner([str(self.bindir / "pg_ctl"), "-D", str(self.directory / "data"), "-m", mode, "stop"])

    def start(self) -> None:
        data, log = str(self.directory / "data"), str(self.directory / "server.log")
        self._as_owner([str(self.bindir / "pg_ctl"), "-D", data, "-w", "-t", "60", "-l", log, "start"])

    def log_tail(self, lines: int = 40) -> str:
        with contextlib.suppress(OSError):
            return "\n".join((self.directory / "server.log").read_text().splitlines()[-lines:])
        return ""

    def _as_owner(self, command: list[str]) -> None:
        if self._run_as is not None:
            command = ["runuser", "-u", self._run_as, "--", *command]
        command = [*self.wrap, *command]
        done = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(command)} failed: {done.stderr.strip() or done.stdout.strip()}")


@contextlib.contextmanager
def running_cluster(
    listen: tuple[str, ...] = ("127.0.0.1",), wrap: tuple[str, ...] = ()
) -> Iterator[Cluster]:
    """Make, start, and in the end stop and remove a cluster listening on listen.

    wrap: the prefix that runs a command where the cluster is to live (`ip netns exec NS`); the
    cluster then listens on listen's addresses of that namespace, and psql dials listen[0] there.
    """
    bindir = server_binaries()
    if bindir is None:
        raise RuntimeError(unavailable())
    # PostgreSQL refuses to run as root: the cluster belongs to the `postgres` user when there is
    # one (Debian's package makes it), else to `nobody`.
    run_as: str | None = None
    if os.geteuid() == 0:
        run_as = "postgres"
        try:
            pwd.getpwnam(run_as)
        except KeyError:
            run_as = "nobody"
    directory = Path(tempfile.mkdtemp(prefix="llmgw-pg-"))
    try:
        if run_as is not None:
            owner = pwd.getpwnam(run_as)
            os.chown(directory, owner.pw_uid, owner.pw_gid)
        cluster = Cluster(
            directory=directory, port=_free_port(), bindir=bindir, run_as=run_as, host=listen[0], wrap=wrap
        )
        initdb = [str(bindir / "initdb"), "-D", str(directory / "data"), "-U", USER, "--auth=trust"]
        cluster._as_owner([*initdb, "-E", "UTF8", "--locale=C.UTF-8", "--no-sync"])
        options = {
            "port": str(cluster.port),
            "listen_addresses": "'" + ",".join(listen) + "'",
            "unix_socket_directories": f"'{directory}'",
            # A test cluster: durability is not what is tested, start-up and speed are.
            "fsync": "off",
            "synchronous_commit": "off",
            "full_page_writes": "off",
            "max_connections": "200",
        }
        with (directory / "data" / "postgresql.conf").open("a") as conf:
            conf.writelines(f"{key} = {value}\n" for key, value in options.items())
        with (directory / "data" / "pg_hba.conf").open("a") as hba:
            # The fleet tests reach the cluster from the addresses of their namespaces.
            hba.write("host all all 198.18.0.0/15 trust\n")
        cluster.start()
        try:
            yield cluster
        finally:
            with contextlib.suppress(RuntimeError, subprocess.TimeoutExpired):
                cluster.stop("immediate")
    finally:
        shutil.rmtree(directory, ignore_errors=True)
