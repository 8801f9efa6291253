"""The agent's end of the stream: dial the control plane, register, heartbeat, carry out its orders.

The agent dials `servers` in order and keeps dialing, with jittered backoff,
for as long as it runs: a control plane that restarts, or a fleet that
restarts all at once, must not find its nodes waiting in lockstep or gone.
Engines keep running while the stream is down; the next Register lists them
so the control plane adopts them instead of starting them again.

The node's address, the one its engines are advertised at, is agent.yaml's
`advertise_address` or else the local address of this very connection: the
address on the network the node shares with the control plane, which is the
one the gateway (on the control plane's host) can reach. On one host that is
127.0.0.1, so a single machine stays on loopback without a word of config.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import random
import ssl
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Protocol

import betterproto
import structlog
from grpclib.client import Channel, Stream
from grpclib.const import Cardinality, Status
from grpclib.exceptions import GRPCError, StreamTerminatedError

import llmgw
from llmgw.agent import logs as agent_logs
from llmgw.agent.discovery.node import NodeReport
from llmgw.backoff import ExponentialBackoff
from llmgw.config import AgentConfig, TLSConfig
from llmgw.keepalive import keep_alive
from llmgw.log import RING, LogRing
from llmgw.pki import certificate_problem, client_ssl_context
from llmgw.proto.llmgw import v1 as pb
from llmgw.stream_words import STANDBY, VERSION_WINDOW
from llmgw.tasks import first_to_finish

log = structlog.get_logger(__name__)

CONNECT = "/llmgw.v1.AgentService/Connect"
# The connection and TLS handshake to one server must be done within this, or the next is dialled:
# a lost SYN is sent again after 1 s, and a new leader is still reached within the takeover bound.
DIAL_TIMEOUT_S = 3.0
# Each round of `servers` in which none took this node doubles the bound, up to this: a control
# plane handshaking with a whole fleet that reconnects at once may take longer than 3 s to reach
# this node, and one that every node gives up on keeps doing handshakes nobody waits for.
DIAL_TIMEOUT_MAX_S = 30.0

_ServerStream = Stream[pb.AgentMessage, pb.ControlMessage]


class ShardSupervisor(Protocol):
    """What the client needs of agent/supervisor.py's Supervisor."""

    # Where the supervisor reports each shard's new state; the client sets it to its own on_status.
    on_status: Callable[[pb.ShardStatus], None] | None

    def advertise(self, address: str) -> None: ...

    async def start(self, req: pb.StartShard) -> None: ...

    async def stop(self, shard_id: str) -> None: ...

    def statuses(self) -> list[pb.ShardStatus]: ...

    async def remove_weights(self, sources: list[str]) -> tuple[list[str], list[str]]: ...

    def output(self, shard_id: str) -> list[str]: ...

    def sources(self) -> list[str]: ...


class Provisioner(Protocol):
    """What the client needs of agent/provision/loop.py's ProvisionLoop."""

    # Set whenever statuses() or engine_versions() would answer differently; the client clears it.
    changed: asyncio.Event

    @property
    def probed(self) -> bool: ...

    def engine_versions(self) -> dict[str, str]: ...

    def statuses(self) -> list[pb.ProvisionStatus]: ...

    def kick(self, provision: pb.Provision) -> None: ...


class Upgrades(Protocol):
    """What the client needs of agent/upgrade.py's Upgrader."""

    # Set whenever status() would answer differently; the client clears it.
    changed: asyncio.Event

    def status(self) -> pb.UpgradeStatus | None: ...

    def ask(self, order: pb.Upgrade) -> None: ...


class AgentClient:
    """Keeps one stream open to the first control plane of cfg.servers that answers."""

    def __init__(
        self,
        cfg: AgentConfig,
        supervisor: ShardSupervisor,
        engine_versions: Mapping[str, str],
        *,
        backoff_base_s: float = 0.5,
        backoff_max_s: float = 30.0,
        register_timeout_s: float = 30.0,
        dial_timeout_s: float = DIAL_TIMEOUT_S,
        ring: LogRing = RING,
        provision: Provisioner | None = None,
        host: pb.Host | None = None,
        warnings: Sequence[str] = (),
        report: NodeReport | None = None,
        upgrades: Upgrades | None = None,
    ) -> None:
        self._cfg = cfg
        # Built-in engines (sim) come from engine_versions; installed ones from the provision loop.
        self._provision = provision
        self._host = host
        self._warnings = list(warnings)
        # GPUs, memory, fabrics, storage and weights (agent/discovery/node.py), when the role gives them.
        self._report = report
        # This node's last upgrade, reported after every Register and as it goes (agent/upgrade.py).
        self._upgrades = upgrades
        self._supervisor = supervisor
        self._engine_versions = dict(engine_versions)
        # Jitter, so a fleet that lost its control plane at once does not dial back at once.
        self._backoff = ExponentialBackoff(base_s=backoff_base_s, cap_s=backoff_max_s, jitter=0.5)
        self._register_timeout_s = register_timeout_s
        self._dial_timeout_s = dial_timeout_s
        # The bound of this round's dials (dial_bound()).
        self._dial_s = dial_timeout_s
        self._ring = ring
        self._outbox: asyncio.Queue[pb.AgentMessage] | None = None
        # Whether the last server dialled said it was a standby; whether it refused this agent's version.
        self._standby = False
        self._outdated = False
        # Set while a control plane has accepted this node's Register; server says which one.
        self.connected = asyncio.Event()
        self.server: str | None = None
        # Wired here rather than by the caller: a supervisor whose statuses go nowhere looks
        # healthy until someone wonders why no replica ever becomes ready.
        supervisor.on_status = self.on_status

    def on_status(self, status: pb.ShardStatus) -> None:
        """The supervisor's callback: send a shard's new state up the stream, if one is open.

        While no stream is open the status is dropped: the next Register carries
        every shard's current state from supervisor.statuses().
        """
        if self._outbox is not None:
            self._outbox.put_nowait(pb.AgentMessage(shard=status))

    async def run(self) -> None:
        """Dial, register and serve the stream until cancelled; reconnect whenever it ends."""
        ssl_context = await asyncio.to_thread(client_ssl_context, self._cfg.tls)
        failures = 0
        while True:
            registered = standby = outdated = False
            self._dial_s = dial_bound(self._dial_timeout_s, failures)
            for address in self._cfg.servers:
                self._standby = self._outdated = False
                registered = await self._attempt(address, ssl_context)
                if registered:
                    break
                standby = standby or self._standby
                outdated = outdated or self._outdated
            failures = failures_after(failures, registered=registered, standby=standby, outdated=outdated)
            await asyncio.sleep(self._backoff.delay(failures))

    async def _attempt(self, address: str, ssl_context: ssl.SSLContext) -> bool:
        """One stream to one server; whether it got as far as being accepted."""
        host, _, port = address.rpartition(":")
        channel = Channel(host.strip("[]"), int(port), ssl=ssl_context)
        try:
            async with channel.request(
                CONNECT, Cardinality.STREAM_STREAM, pb.AgentMessage, pb.ControlMessage
            ) as stream:
                await self._session(address, stream)
                # The server ended the stream; grpclib wants this side ended too before it lets go.
                await stream.end()
        except asyncio.CancelledError:
            raise
        except GRPCError as exc:
            if exc.status is Status.FAILED_PRECONDITION and VERSION_WINDOW in (exc.message or ""):
                # Not a warning that passes: this node stays out of work until someone upgrades.
                self._outdated = True
                log.error(
                    "the control plane refused this agent's version",
                    server=address,
                    agent_version=llmgw.__version__,
                    error=_explain(exc, address),
                )
            elif exc.status is not Status.UNAVAILABLE or not (exc.message or "").startswith(STANDBY):
                self._failed(exc, _explain(exc, address), address)
            else:
                # Expected of every standby the list names before the leader: not a warning.
                self._standby = True
                log.info(
                    "a standby turned this node away; trying the next server",
                    server=address,
                    said=exc.message,
                )
        except Exception as exc:
            why = _explain(exc, address)
            if isinstance(exc, ssl.SSLCertVerificationError) and exc.verify_code in _NAME_MISMATCH:
                why = await self._name_mismatch(host.strip("[]"), int(port), address)
            if isinstance(exc, StreamTerminatedError) and not self.connected.is_set():
                # A server that refuses a client certificate drops the connection without a word
                # this side can read (asyncio does not flush the TLS alert), so look at it here.
                problem = await asyncio.to_thread(
                    certificate_problem, Path(self._cfg.tls.cert), Path(self._cfg.tls.ca)
                )
                if problem:
                    why = f"the server at {address} hung up before this node registered: {problem}"
            self._failed(exc, why, address)
        else:
            log.info("the control plane ended the stream", server=address)
        finally:
            was_connected = self.connected.is_set()
            self._outbox = None
            self.connected.clear()
            self.server = None
            channel.close()
        return was_connected

    def _failed(self, exc: BaseException, why: str, address: str) -> None:
        log.warning("the control plane stream failed", server=address, error=why, exc_info=_unexpected(exc))

    async def _name_mismatch(self, host: str, port: int, address: str) -> str:
        """Say which names the server's certificate has, when it lacks the one this node dialled."""
        names = await _names_presented(host, port, self._cfg.tls)
        has = f"it names {', '.join(names)}" if names else "its names could not be read"
        return (
            f"the server at {address} presented a certificate that does not name {host} ({has}): "
            f"dial a name it has in servers:, or add {host} to it on the control plane "
            f"(`llmgw server init --host {host}`)"
        )

    async def _session(self, address: str, stream: _ServerStream) -> None:
        # The outbox exists before statuses() is read, so a status that changes in between is sent after.
        outbox: asyncio.Queue[pb.AgentMessage] = asyncio.Queue()
        self._outbox = outbox
        # Connected first, so the connection's own local address is known before Register says it,
        # and before any StartShard (which can only come down this stream) needs it.
        try:
            # A server whose machine vanished behind a router answers nothing, not even "unreachable":
            # the kernel would retry the connection for about two minutes before the next of
            # `servers` is dialled, far past the takeover bound (docs/operations.md).
            async with asyncio.timeout(self._dial_s):
                await stream.send_request()
        except TimeoutError:
            raise TimeoutError(
                f"no answer within {self._dial_s:g} s (its machine may be down or cut off from this one)"
            ) from None
        # A control plane whose machine vanished sends nothing to say so: noticed within seconds
        # (llmgw/keepalive.py), the agent dials the next server, where a standby is taking over.
        keep_alive(getattr(stream.peer, "_transport", None))
        advertised = self._cfg.advertise_address or _local_address(stream)
        if not advertised:
            log.warning(
                "cannot tell this end's address of the connection to the control plane; engines keep the "
                "address they had (127.0.0.1 at first): set advertise_address in agent.yaml",
                server=address,
            )
        self._supervisor.advertise(advertised)
        register = self._register(advertised)
        if self._report is not None:
            self._report.fill_register(register)
        await stream.send_message(pb.AgentMessage(register=register))
        try:
            # Not wait_for, which on 3.11 swallows a cancel landing as the answer does: see _send.
            async with asyncio.timeout(self._register_timeout_s):
                first = await stream.recv_message()
        except TimeoutError:
            raise TimeoutError(f"no answer to Register within {self._register_timeout_s:g} s") from None
        if first is None:
            return
        if betterproto.which_one_of(first, "kind")[0] == "ack":
            self.server = address
            self.connected.set()
            log.info(
                "registered with the control plane",
                server=address,
                node=self._cfg.node_id,
                agent_version=llmgw.__version__,
                # Empty from a server older than the version window (docs/operations.md, "Versions").
                server_version=first.ack.server_version or "unknown",
            )
        else:
            await self._handle(first)
        jobs = [self._receive(stream), self._send(stream, outbox)]
        if self._provision is not None:
            jobs.append(self._report_provision(self._provision, outbox))
        if self._report is not None:
            jobs.append(self._report_node(self._report, outbox))
        if self._upgrades is not None:
            jobs.append(self._report_upgrade(self._upgrades, outbox))
        await first_to_finish(*jobs)

    def _engines(self) -> dict[str, str]:
        if self._provision is None:
            return dict(self._engine_versions)
        return {**self._engine_versions, **self._provision.engine_versions()}

    def _register(self, address: str) -> pb.Register:
        provision = self._provision
        if provision is not None:
            # Register carries everything as of now; only what changes after it needs a heartbeat.
            provision.changed.clear()
        return pb.Register(
            node_id=self._cfg.node_id,
            agent_version=llmgw.__version__,
            engine_versions=self._engines(),
            engines_probed=provision.probed if provision is not None else True,
            host=self._host,
            warnings=list(self._warnings),
            provision=provision.statuses() if provision is not None else [],
            running=self._supervisor.statuses(),
            labels=dict(self._cfg.labels),
            heartbeat_interval_ms=int(self._cfg.heartbeat_interval_s * 1000),
            advertise_address=address,
            fabric_address=self._cfg.fabric_address,
        )

    async def _send(self, stream: _ServerStream, outbox: asyncio.Queue[pb.AgentMessage]) -> None:
        loop = asyncio.get_running_loop()
        interval = self._cfg.heartbeat_interval_s
        sequence = 0
        due = loop.time() + beat_gap(interval)
        while True:
            try:
                # Not wait_for: on 3.11 it swallows a cancel that lands as a message arrives, and the
                # stream's teardown then waited on this loop forever.
                async with asyncio.timeout(max(0.0, due - loop.time())):
                    message = await outbox.get()
            except TimeoutError:
                sequence += 1
                beat = pb.Heartbeat(sequence=sequence)
                if self._report is not None:
                    self._report.fill_heartbeat(beat)
                message = pb.AgentMessage(heartbeat=beat)
                due = loop.time() + beat_gap(interval)
            await stream.send_message(message)

    async def _report_provision(self, provision: Provisioner, outbox: asyncio.Queue[pb.AgentMessage]) -> None:
        """A heartbeat with the installs and engines each time the provision loop's outcome changes."""
        while True:
            await provision.changed.wait()
            provision.changed.clear()
            beat = pb.Heartbeat(
                provision_changed=True,
                provision=provision.statuses(),
                engines_changed=True,
                engine_versions=self._engines(),
            )
            outbox.put_nowait(pb.AgentMessage(heartbeat=beat))

    async def _report_upgrade(self, upgrades: Upgrades, outbox: asyncio.Queue[pb.AgentMessage]) -> None:
        """Where this node's last upgrade stands: once after Register, then each time it changes."""
        while True:
            upgrades.changed.clear()
            status = upgrades.status()
            if status is not None:
                outbox.put_nowait(pb.AgentMessage(upgrade=status))
            await upgrades.changed.wait()

    async def _report_node(self, report: NodeReport, outbox: asyncio.Queue[pb.AgentMessage]) -> None:
        """A heartbeat as soon as a refresh finds the node changed (a disk filled by a download, say)."""
        while True:
            await report.changed.wait()
            report.changed.clear()
            beat = report.fill_heartbeat(pb.Heartbeat())
            if beat.storage_changed or beat.gpus_changed or beat.fabrics_changed or beat.weights_changed:
                outbox.put_nowait(pb.AgentMessage(heartbeat=beat))

    async def _receive(self, stream: _ServerStream) -> None:
        async for message in stream:
            await self._handle(message)

    async def _handle(self, message: pb.ControlMessage) -> None:
        kind, _ = betterproto.which_one_of(message, "kind")
        if kind == "start":
            await self._start(message.start)
        elif kind == "stop":
            log.info("stopping a shard", shard=message.stop.shard_id, reason=message.stop.reason)
            await self._supervisor.stop(message.stop.shard_id)
        elif kind == "logs":
            # Answered here, on the receive loop, because answering never waits: a copy of at most
            # 2000 lines, queued on an outbox without bound. A reply that could block would have to
            # go to a task of its own, or one slow reply would hold up the next StartShard.
            reply = agent_logs.answer(message.logs, self._ring, self._supervisor)
            if self._outbox is not None:
                self._outbox.put_nowait(pb.AgentMessage(logs=reply))
        elif kind == "remove_weights":
            await self._remove_weights(message.remove_weights)
        elif kind == "provision":
            if self._provision is not None:
                self._provision.kick(message.provision)
        elif kind == "upgrade":
            if self._upgrades is not None:
                self._upgrades.ask(message.upgrade)
        elif kind != "ack":
            log.info("ignored an order this agent does not carry out yet", kind=kind)

    async def _remove_weights(self, req: pb.RemoveWeights) -> None:
        # Awaited on the receive loop: deleting a directory is quick next to a download, and an order
        # that arrives meanwhile then finds the weights already gone rather than half gone.
        removed, kept = await self._supervisor.remove_weights(list(req.sources))
        log.info("removed weights the control plane asked to", removed=removed, kept=kept)

    async def _start(self, req: pb.StartShard) -> None:
        log.info("starting a shard", shard=req.shard_id, model=req.model, engine=req.engine)
        try:
            await self._supervisor.start(req)
        except Exception as exc:
            # One shard that cannot start must not cost the node its stream and every other shard.
            log.exception("could not start a shard", shard=req.shard_id)
            self.on_status(
                pb.ShardStatus(
                    shard_id=req.shard_id,
                    model=req.model,
                    engine=req.engine,
                    state="failed",
                    detail=str(exc) or type(exc).__name__,
                    profile=req.profile,
                )
            )


def dial_bound(base_s: float, failures: int) -> float:
    """How long one dial may take after `failures` rounds in a row in which no server took this node."""
    grown: float = base_s * 2.0 ** min(failures, 16)
    return min(grown, max(DIAL_TIMEOUT_MAX_S, base_s))


# Failures in a row the wait is held at while standbys answer: at most 2 s with the default base.
STANDBY_FAILURES = 3


# Failures in a row a refusal of this agent's version counts as at least: the longest wait there is.
OUTDATED_FAILURES = 64


def failures_after(failures: int, *, registered: bool, standby: bool, outdated: bool = False) -> int:
    """The failures in a row after one round of `servers`, which set the wait before the next round.

    A stream that ended after its Register counts as the first failure: the shortest wait. While a
    standby answers, a leader holds the lock or one takes it within seconds: a wait grown long
    over earlier failures would keep this node from the new leader past the takeover bound.
    A server that refused this agent's version takes it only once one of them is upgraded: the
    longest wait at once, rather than a fleet of refused agents dialling it several times a second.
    """
    failures = 1 if registered else failures + 1
    if standby:
        return min(failures, STANDBY_FAILURES)
    return max(failures, OUTDATED_FAILURES) if outdated else failures


# OpenSSL's X509_V_ERR_HOSTNAME_MISMATCH and X509_V_ERR_IP_ADDRESS_MISMATCH.
_NAME_MISMATCH = (62, 64)


async def _names_presented(host: str, port: int, tls: TLSConfig) -> list[str]:
    """The names in the certificate the server at host:port presents, read without checking them.

    The chain is still checked against tls.ca, and this node's own certificate is
    presented, so the server sees an ordinary connection that closes at once.
    """
    context = await asyncio.to_thread(client_ssl_context, tls)
    context.check_hostname = False
    try:
        async with asyncio.timeout(5):
            _, writer = await asyncio.open_connection(host, port, ssl=context)
    except (OSError, TimeoutError):
        return []
    cert = writer.get_extra_info("peercert") or {}
    writer.close()
    with contextlib.suppress(OSError):
        await writer.wait_closed()
    return [str(value) for kind, value in cert.get("subjectAltName", ()) if kind in ("DNS", "IP Address")]


def _local_address(stream: _ServerStream) -> str:
    """This end's address of the stream's connection; empty when the transport does not say."""
    # grpclib's Peer tells only the far end's address (addr()); the near end is on its transport.
    transport = getattr(stream.peer, "_transport", None)
    sockname = transport.get_extra_info("sockname") if transport is not None else None
    if not sockname:
        return ""
    try:
        address = ipaddress.ip_address(str(sockname[0]).partition("%")[0])
    except ValueError:
        return ""
    # A dual-stack socket names an IPv4 peer's connection ::ffff:10.0.0.5; the gateway dials 10.0.0.5.
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return str(address.ipv4_mapped)
    return str(address)


def _explain(exc: BaseException, address: str) -> str:
    """Why the stream to address failed, for the person reading the agent's log."""
    if isinstance(exc, ssl.SSLCertVerificationError):
        return (
            f"the server at {address} presented a certificate this node does not trust "
            f"({exc.verify_message}); tls.ca must be the authority that signed it, and it must name {address}"
        )
    if isinstance(exc, ssl.SSLError):
        return (
            f"the server at {address} refused this node's certificate ({exc}): "
            "it must be signed by the authority the server trusts (`llmgw cert issue-agent`)"
        )
    if isinstance(exc, ConnectionRefusedError):
        return f"nothing is listening at {address}"
    if isinstance(exc, GRPCError):
        return f"the server at {address} refused the stream: {exc.message}"
    if isinstance(exc, StreamTerminatedError):
        return f"the server at {address} closed the connection ({exc})"
    if isinstance(exc, OSError):
        return f"cannot reach {address}: {exc.strerror or exc}"
    return f"{type(exc).__name__}: {exc}"


def _unexpected(exc: BaseException) -> bool:
    """Whether a traceback helps: not for the ways a network or a peer ordinarily fails."""
    return not isinstance(exc, (OSError, GRPCError, StreamTerminatedError, TimeoutError))


# How much earlier than its interval a heartbeat may go, as a fraction of it.
BEAT_JITTER = 0.2


def beat_gap(interval_s: float, draw: Callable[[], float] = random.random) -> float:
    """The wait before the next heartbeat: the interval less up to BEAT_JITTER of it, at random.

    Nodes that connected together (every one of them, after the control plane
    restarts) would otherwise beat together for ever, and thousands of
    heartbeats landing in one instant stall the loop the gateway shares. Only
    ever earlier, never later: the gap the control plane's grace is set
    against stays at most the interval.
    """
    return interval_s * (1.0 - BEAT_JITTER * draw())
