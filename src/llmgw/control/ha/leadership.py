"""Which of several control planes sharing one PostgreSQL leads: a session-level advisory lock.

Several servers on one PostgreSQL database all serve their gateway, but only
one may accept agents, place and reconcile: two placing at once would start
every replica twice. The leader is the server whose dedicated connection holds
`pg_try_advisory_lock(LOCK_KEY)`. The lock belongs to that connection's
session, so it is released the moment the connection ends: at once when the
leader's process dies (its kernel closes the socket), within PostgreSQL's TCP
keepalive bound when the leader's machine vanishes (set on this connection:
see _SERVER_SETTINGS). Standbys try to take it every `poll_s`.

A leader that can no longer reach PostgreSQL must stop acting as one before a
standby can take over, or two would place at once: every poll runs a query
with a deadline shorter than PostgreSQL's own keepalive bound, and a leader
whose query fails or is late drops the connection and steps down.

Every server keeps a row in `llmgw_control_planes` (its name, the agent address
it advertises, the session that holds its connection, when it was last seen),
and the leader is read from PostgreSQL's own lock table joined to those rows:
never a flag a dead leader could leave behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

import asyncpg
import attrs
import structlog

from llmgw.backoff import ExponentialBackoff
from llmgw.config.database import PostgresUrl
from llmgw.keepalive import keep_alive
from llmgw.stream_words import STANDBY

log = structlog.get_logger(__name__)

T = TypeVar("T")

# The advisory lock of the leadership: "llmgw" and 0x10, a 64-bit key no other application is likely
# to use. Not the store's migration lock ("llmgw" and 1, store/dialect.py): a standby waiting on the
# store's migrations behind a leader holding that key would wait for ever.
LOCK_KEY = 0x6C6C6D6777000010
# Held for a moment while the tables are made, so two servers starting together do not race on them.
_SCHEMA_KEY = 0x6C6C6D6777000011
# How often a standby tries the lock, and every server says it is alive.
POLL_S = 1.0
# A poll's query must answer within this, or the connection is taken for lost (and the lock with it).
QUERY_TIMEOUT_S = 3.0
CONNECT_TIMEOUT_S = 5.0
# PostgreSQL's side of the lock connection: a leader whose machine vanished (no FIN, no RST) is
# declared dead after 3 s idle and 3 unanswered probes a second apart, or 6 s of unacknowledged
# data, and its lock is released. The leader's own deadline (POLL_S + QUERY_TIMEOUT_S = 4 s) is
# shorter, so it has stepped down before a standby can take the lock. These are the session's own
# settings: no change to postgresql.conf is needed.
_SERVER_SETTINGS = {
    "tcp_keepalives_idle": "3",
    "tcp_keepalives_interval": "1",
    "tcp_keepalives_count": "3",
    "tcp_user_timeout": "6000",
}


# The servers sharing the database; and the routing table the leader publishes (fleet_routes.py).
_SCHEMA = """
CREATE TABLE IF NOT EXISTS llmgw_control_planes (
    name text PRIMARY KEY,
    advertise text NOT NULL,
    pid integer NOT NULL,
    last_seen timestamptz NOT NULL
);
CREATE TABLE IF NOT EXISTS llmgw_routing (
    id integer PRIMARY KEY CHECK (id = 1),
    leader text NOT NULL,
    generation bigint NOT NULL,
    routes text NOT NULL,
    published_at timestamptz NOT NULL
)
"""
_SEEN = """
INSERT INTO llmgw_control_planes (name, advertise, pid, last_seen) VALUES ($1, $2, pg_backend_pid(), now())
ON CONFLICT (name) DO UPDATE SET advertise = $2, pid = pg_backend_pid(), last_seen = now()
"""
# The control plane whose session holds the lock in this database, from PostgreSQL's lock table.
# An advisory lock on one bigint shows as classid (its high half), objid (its low half), objsubid 1.
_LEADER = """
SELECT c.name, c.advertise FROM llmgw_control_planes c
JOIN pg_locks l ON l.pid = c.pid
WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1
  AND l.classid = $1::bigint::oid AND l.objid = $2::bigint::oid
  AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
"""
# Another live session already going by this name: two servers given the same control.name.
_TWIN = """
SELECT c.advertise FROM llmgw_control_planes c JOIN pg_stat_activity a ON a.pid = c.pid
WHERE c.name = $1 AND c.pid <> pg_backend_pid() AND a.application_name = $2
"""


@attrs.frozen
class Leader:
    """The control plane that holds the lock, as the others name it."""

    name: str
    advertise: str


class Leadership:
    """This server's side of the election: whether it leads, who does, and the connection holding it.

    Used as an async context manager: the polling task runs inside it. `use` runs
    other work on the same connection (the routing table is published on it, so
    a leader that lost its lock can publish nothing more), and `on_connect`
    callbacks run after every new connection (a LISTEN must be made again).
    """

    def __init__(
        self,
        url: str,
        name: str,
        advertise: str,
        *,
        poll_s: float = POLL_S,
        query_timeout_s: float = QUERY_TIMEOUT_S,
    ) -> None:
        self.url = url
        self.name = name
        self.advertise = advertise
        self._poll_s = poll_s
        self._query_timeout_s = query_timeout_s
        self._connection: asyncpg.Connection | None = None
        # One query at a time on the connection: asyncpg refuses a second while one runs.
        self._busy = asyncio.Lock()
        self._leading = asyncio.Event()
        self._standby = asyncio.Event()
        self._standby.set()
        self.leader: Leader | None = None
        # How many times this server has taken the lead: what was settled in one term is not in the next.
        self.term = 0
        self._on_connect: list[Callable[[asyncpg.Connection], Awaitable[None]]] = []
        self._backoff = ExponentialBackoff(base_s=0.5, cap_s=5.0, jitter=0.5)
        self._task: asyncio.Task[None] | None = None

    # --- what the rest of the server reads

    @property
    def leading(self) -> bool:
        return self._leading.is_set()

    async def wait_leading(self) -> None:
        await self._leading.wait()

    async def wait_standby(self) -> None:
        await self._standby.wait()

    def refusal(self) -> str | None:
        """The sentence an agent is refused with while this server is a standby; None while it leads."""
        if self.leading:
            return None
        leader = self.leader
        if leader is None or leader.name == self.name:
            return f"{STANDBY}; no control plane holds the leadership right now (one takes it within seconds)"
        return f"{STANDBY}; the leader is {leader.name} at {leader.advertise}"

    def on_connect(self, callback: Callable[[asyncpg.Connection], Awaitable[None]]) -> None:
        """Run callback(connection) after every new connection, before the next poll."""
        self._on_connect.append(callback)

    async def use(self, work: Callable[[asyncpg.Connection], Awaitable[T]]) -> T:
        """Run work on the lock's connection; ConnectionError while there is none."""
        async with self._busy:
            connection = self._connection
            if connection is None or connection.is_closed():
                raise ConnectionError(f"no connection to PostgreSQL at {_where(self.url)}")
            async with asyncio.timeout(self._query_timeout_s):
                return await work(connection)

    # --- the election

    async def __aenter__(self) -> Leadership:
        self._task = asyncio.create_task(self.run(), name="leadership")
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        # The task's end dropped the connection, and the lock with it: a standby takes it at its next poll.
        if self.leading:
            log.info("this control plane lets go of the leadership: it is stopping", name=self.name)
        self._leading.clear()
        self._standby.set()

    async def run(self) -> None:
        """Connect, poll the lock, and reconnect whenever the connection is lost; until cancelled."""
        failures = 0
        while True:
            try:
                connection = await self._connect()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                failures += 1
                log.warning(
                    "cannot reach PostgreSQL for the leadership; this server stays a standby",
                    database=_where(self.url),
                    error=_said(exc),
                )
                await asyncio.sleep(self._backoff.delay(failures))
                continue
            failures = 0
            try:
                await self._hold(connection)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning(
                    "lost the connection to PostgreSQL that holds the leadership",
                    database=_where(self.url),
                    error=_said(exc),
                    was_leader=self.leading,
                )
            finally:
                self._connection = None
                connection.terminate()
            self._step_down("its connection to PostgreSQL was lost")
            await asyncio.sleep(self._backoff.delay(1))

    async def _connect(self) -> asyncpg.Connection:
        settings = {**_SERVER_SETTINGS, "application_name": _application(self.name)}
        connection = await asyncpg.connect(self.url, timeout=CONNECT_TIMEOUT_S, server_settings=settings)
        # The same from this side (llmgw/keepalive.py), so a connection to a vanished PostgreSQL ends too.
        keep_alive(getattr(connection, "_transport", None))
        try:
            async with asyncio.timeout(self._query_timeout_s * 3):
                async with connection.transaction():
                    await connection.execute("SELECT pg_advisory_xact_lock($1)", _SCHEMA_KEY)
                    await connection.execute(_SCHEMA)
                twin = await connection.fetchval(_TWIN, self.name, _application(self.name))
                for callback in self._on_connect:
                    await callback(connection)
        except BaseException:
            connection.terminate()
            raise
        if twin is not None:
            log.error(
                "another control plane sharing this database has the same name; give each its own "
                "control.name, or standbys will name the wrong leader",
                name=self.name,
                other=twin,
            )
        self._connection = connection
        return connection

    async def _hold(self, connection: asyncpg.Connection) -> None:
        high, low = LOCK_KEY >> 32, LOCK_KEY & 0xFFFFFFFF
        while True:
            async with self._busy, asyncio.timeout(self._query_timeout_s):
                if connection.is_closed():
                    raise ConnectionError("the connection closed")
                took = False
                if not self.leading:
                    took = bool(await connection.fetchval("SELECT pg_try_advisory_lock($1)", LOCK_KEY))
                await connection.execute(_SEEN, self.name, self.advertise)
                row = await connection.fetchrow(_LEADER, high, low)
            self.leader = Leader(name=row["name"], advertise=row["advertise"]) if row is not None else None
            if took:
                self._step_up()
            await asyncio.sleep(self._poll_s)

    def _step_up(self) -> None:
        log.info("this control plane is now the leader", name=self.name, advertise=self.advertise)
        self.term += 1
        self._standby.clear()
        self._leading.set()

    def _step_down(self, why: str) -> None:
        if self._leading.is_set():
            log.warning("this control plane is no longer the leader", name=self.name, reason=why)
        self._leading.clear()
        self._standby.set()


async def while_leading(leadership: Leadership | None, work: Callable[[], Coroutine[Any, Any, None]]) -> None:
    """Run work() while this server leads: started on taking the lead, cancelled on losing it.

    Without a leadership (SQLite: one server, always the leader) work runs from the start.
    """
    if leadership is None:
        await work()
        return
    while True:
        await leadership.wait_leading()
        running = asyncio.create_task(work(), name="leader-work")
        watch = asyncio.create_task(leadership.wait_standby(), name="leader-watch")
        try:
            await asyncio.wait({running, watch}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (running, watch):
                task.cancel()
            await asyncio.gather(running, watch, return_exceptions=True)
        if running.done() and not running.cancelled() and running.exception() is not None:
            log.error("the leader's work failed", exc_info=running.exception())
        # Work that ended on its own is started again only at the next takeover.
        await leadership.wait_standby()


def _application(name: str) -> str:
    """The session's application_name: what pg_stat_activity shows an administrator."""
    return f"llmgw {name}"[:63]


def plane_name(configured: str) -> str:
    """control.name, or the machine's host name."""
    return configured or socket.gethostname()


def advertised(configured: str, agent_host: str, agent_port: int) -> str:
    """control.advertise, or the agent listener as bound (the host name where it listens on every address)."""
    if configured:
        return configured
    host = agent_host
    if host in ("", "0.0.0.0", "::", "[::]"):
        host = socket.gethostname()
    elif ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"{host}:{agent_port}"


def _where(url: str) -> str:
    """The URL without its password, for logs and errors."""
    try:
        return str(PostgresUrl.parse(url))
    except ValueError:
        return url.rpartition("@")[2]


def _said(exc: BaseException) -> str:
    if isinstance(exc, TimeoutError):
        return "no answer in time"
    return str(exc) or type(exc).__name__
