"""The agent service: one mutual-TLS gRPC stream per node, the node named by its certificate.

The generated `AgentServiceBase` hands a handler only the message iterator,
but a node's identity lives on grpclib's `Stream` (`stream.peer.cert()`), so
this service provides `__mapping__` itself and keeps the generated messages.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator, Callable, Coroutine
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path
from typing import Any, Protocol

import betterproto
import structlog
from grpclib.const import Cardinality, Handler, Status
from grpclib.exceptions import GRPCError
from grpclib.server import Server, Stream

import llmgw
from llmgw.config import ServerConfig
from llmgw.control.inventory import Inventory, Link
from llmgw.control.records import Registration
from llmgw.control.stream.handshake import Handshakes
from llmgw.control.stream.inbox import take_over
from llmgw.control.stream.provision import provision_message
from llmgw.control.stream.wire import AgentMessages, Beat, registration
from llmgw.listen import cannot_listen, split_host_port
from llmgw.names import node_id_problem
from llmgw.pki import certificate_names, server_ssl_context
from llmgw.proto.llmgw import v1 as pb
from llmgw.tasks import first_to_finish
from llmgw.versions import refusal as version_refusal

log = structlog.get_logger(__name__)

CONNECT = "/llmgw.v1.AgentService/Connect"
# An agent that opens a stream and never registers holds a connection for nothing.
REGISTER_TIMEOUT_S = 30.0

_AgentStream = Stream[pb.AgentMessage | Beat | Registration, pb.ControlMessage]


class Gate(Protocol):
    """Whether this control plane may take agents: control/ha/leadership.py's Leadership."""

    def refusal(self) -> str | None:
        """The sentence an agent is refused with while this server is a standby; None while it leads."""
        ...

    async def wait_standby(self) -> None:
        """Return once this server is (or is again) a standby."""
        ...


class AgentService:
    """The grpclib handler of AgentService.Connect."""

    def __init__(
        self,
        inventory: Inventory,
        register_timeout_s: float = REGISTER_TIMEOUT_S,
        provision: pb.Provision | None = None,
        refused: Callable[[str], None] = lambda reason: None,
        gate: Gate | None = None,
        version: str = llmgw.__version__,
    ) -> None:
        """refused is told why each connection was turned away (a short fixed word, for metrics).

        gate, with several control planes, turns agents away while this one is a standby, and ends
        every stream when it stops leading; without one this server always leads. version is this
        server's llmgw version, which sets the agent versions it takes (llmgw/versions.py).
        """
        self._inventory = inventory
        self._version = version
        self._gate = gate
        self._refused = refused
        # The engines every node should have, sent after each Ack: a node rebuilt from nothing or
        # an agent restarted converges without anyone asking it to.
        self._provision = provision
        self._register_timeout_s = register_timeout_s
        self._closing = asyncio.Event()
        self._streams = 0
        self._all_ended = asyncio.Event()
        self._all_ended.set()

    async def close(self, timeout_s: float = 2.0) -> None:
        """End every node's stream with a status saying why, so agents dial again instead of waiting.

        grpclib's own close only cancels handlers, which leaves an agent's
        connection open and its stream silent: the agent would never notice.
        """
        self._closing.set()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._all_ended.wait(), timeout_s)

    def __mapping__(self) -> dict[str, Handler]:
        return {
            # AgentMessages reads a plain heartbeat by hand (control/stream/wire.py): the generated
            # classes' cost per heartbeat was what limited how many nodes one server holds.
            CONNECT: Handler(self._connect, Cardinality.STREAM_STREAM, AgentMessages, pb.ControlMessage)
        }

    async def _connect(self, stream: _AgentStream) -> None:
        self._streams += 1
        self._all_ended.clear()
        try:
            await self._serve(stream)
        finally:
            self._streams -= 1
            if not self._streams:
                self._all_ended.set()

    def _refuse(self, reason: str, status: Status, message: str) -> GRPCError:
        self._refused(reason)
        return GRPCError(status, message)

    async def _serve(self, stream: _AgentStream) -> None:
        if self._closing.is_set():
            raise self._refuse("shutting_down", Status.UNAVAILABLE, "the control plane is shutting down")
        standby = self._gate.refusal() if self._gate is not None else None
        if standby is not None:
            # UNAVAILABLE and a sentence naming the leader: the agent moves on to its next server at once.
            raise self._refuse("standby", Status.UNAVAILABLE, standby)
        cert_node = _common_name(stream.peer.cert())
        peer = stream.peer.addr()
        where = f"{peer[0]}:{peer[1]}" if peer else ""
        if not cert_node:
            log.warning("refused a node whose certificate names no node", peer=where)
            self._inventory.refused.refuse(where, "certificate has no common name, so it names no node")
            raise self._refuse(
                "no_common_name",
                Status.UNAUTHENTICATED,
                "the client certificate has no common name, so it names no node; "
                "issue one with `llmgw cert issue-agent NODE`",
            )
        # A certificate from an authority llmgw did not fill (issue-agent refuses such ids): the id
        # goes into URLs, pages and log fields, and a newline or a '/' there is not a node.
        problem = node_id_problem(cert_node)
        if problem is not None:
            raise GRPCError(
                Status.PERMISSION_DENIED,
                f"the client certificate's common name cannot be a node: {problem}; "
                "issue one with `llmgw cert issue-agent NODE`",
            )
        try:
            first = await asyncio.wait_for(stream.recv_message(), self._register_timeout_s)
        except TimeoutError:
            raise self._refuse(
                "register_timeout",
                Status.DEADLINE_EXCEEDED,
                f"node {cert_node} did not register within {self._register_timeout_s:g} s",
            ) from None
        if first is None:
            return
        if isinstance(first, Registration):
            register = first
        elif isinstance(first, Beat) or betterproto.which_one_of(first, "kind")[0] != "register":
            raise self._refuse(
                "not_registered",
                Status.FAILED_PRECONDITION,
                f"node {cert_node} must register before it sends anything else",
            )
        else:
            register = registration(first.register)
        named = register.node_id
        if named != cert_node:
            log.warning(
                "refused a node registering as another", peer=where, certificate=cert_node, register=named
            )
            self._inventory.refused.refuse(where, f"certificate for {cert_node} used to register as {named}")
            raise self._refuse(
                "wrong_node",
                Status.PERMISSION_DENIED,
                f"node {named} presented a certificate for {cert_node}: a node may only register as itself",
            )
        self._check_version(register, where)
        link = self._inventory.attach(register, where)
        # The agent counts itself connected only on this: a refusal arrives as the stream's status instead.
        ack = pb.Ack(ref="register", ok=True, server_version=self._version)
        link.outbox.put_nowait(pb.ControlMessage(ack=ack))
        if self._provision is not None:
            link.outbox.put_nowait(pb.ControlMessage(provision=self._provision))
        ends: list[Coroutine[Any, Any, object]] = [link.replaced.wait(), self._closing.wait()]
        if self._gate is not None:
            # A leader that lost its lock must let go of its agents, or two control planes would place.
            ends.append(self._gate.wait_standby())
        try:
            await first_to_finish(self._receive(stream, cert_node), self._send(stream, link), *ends)
        finally:
            self._inventory.detach(link)
        if self._closing.is_set():
            raise GRPCError(Status.UNAVAILABLE, "the control plane is shutting down")
        stepped_down = self._gate.refusal() if self._gate is not None else None
        if stepped_down is not None and not link.replaced.is_set():
            raise GRPCError(Status.UNAVAILABLE, stepped_down)
        if link.replaced.is_set():
            raise GRPCError(
                Status.ABORTED, f"node {cert_node} opened a newer stream, which replaces this one"
            )

    def _check_version(self, register: Registration, where: str) -> None:
        """Refuse an agent outside this server's version window, in words that say which end to upgrade."""
        node, version = register.node_id, register.agent_version
        if not version:
            # Every agent before versions were checked sends none: refusing it would strand a fleet
            # whose servers were upgraded first, as docs/operations.md tells an operator to do.
            log.warning(
                "a node's agent does not say its version; taking it: upgrade it to the server's version",
                node=node,
                peer=where,
                server_version=self._version,
            )
            return
        why = version_refusal(version, self._version)
        if why is None:
            return
        log.warning(
            "refused a node whose agent version this server does not take", node=node, peer=where, error=why
        )
        self._inventory.refused.refuse(where, why)
        raise self._refuse("version", Status.FAILED_PRECONDITION, f"node {node}: {why}")

    async def _receive(self, stream: _AgentStream, node_id: str) -> None:
        """Hand each message the node sends on to the inventory as it arrives, until the stream ends.

        Through an Inbox (control/stream/inbox.py), not `async for`: at thousands of nodes, a
        task woken and a chain of coroutines made for every heartbeat held the loop.
        """
        inbox = take_over(stream._stream, AgentMessages.FromString, partial(self._arrived, node_id))
        try:
            await inbox.ended
        finally:
            # What arrives once this handler has ended (a newer stream replaced this one) is not the
            # node's word any more: as when it was read by this task, it is dropped.
            inbox.close()

    def _arrived(self, node_id: str, message: pb.AgentMessage | Beat | Registration) -> None:
        if isinstance(message, Beat):
            self._inventory.beat(node_id, message.memory)
            return
        kind, value = (
            ("register", message)
            if isinstance(message, Registration)
            else betterproto.which_one_of(message, "kind")
        )
        if kind == "heartbeat":
            self._inventory.heartbeat(node_id, value)
        elif kind == "shard":
            self._inventory.shard_status(node_id, value)
        elif kind == "logs":
            self._inventory.touch(node_id)
            self._inventory.logs.resolve(node_id, value)
        elif kind == "upgrade":
            self._inventory.upgrade_status(node_id, value)
        elif kind == "register":
            raise GRPCError(Status.FAILED_PRECONDITION, f"node {node_id} registered twice on one stream")
        else:
            self._inventory.touch(node_id)

    async def _send(self, stream: _AgentStream, link: Link) -> None:
        while True:
            message = await link.outbox.get()
            await stream.send_message(message)


@asynccontextmanager
async def serve_agents(
    cfg: ServerConfig,
    inventory: Inventory,
    refused: Callable[[str], None] = lambda reason: None,
    gate: Gate | None = None,
    version: str = llmgw.__version__,
) -> AsyncIterator[int]:
    """Listen on cfg.agent_listen with mutual TLS and expire silent nodes; yields the bound port.

    refused is told why each connection was turned away: tls, no_common_name, register_timeout,
    not_registered, wrong_node, version, shutting_down or standby. gate and version: see AgentService.
    """
    ssl_context = await asyncio.to_thread(server_ssl_context, cfg.tls)
    names = await asyncio.to_thread(certificate_names, Path(cfg.tls.cert))
    handshakes = Handshakes(ssl_context, names, inventory.refused, refused)
    host, port = split_host_port(cfg.agent_listen, "agent_listen")
    service = AgentService(
        inventory,
        provision=provision_message(cfg.engines, cfg.engine_mirror),
        refused=refused,
        gate=gate,
        version=version,
    )
    server = _TLSServer([service], handshakes)
    try:
        # grpclib does not say which port it bound, and agent_listen may ask for port 0 (tests,
        # dev): such a port is chosen here first. No ssl either: each connection's handshake is
        # made by `handshakes`, which reports its failures.
        bound = port or await asyncio.to_thread(free_port, host)
        await server.start(host, bound)
    except OSError as exc:
        raise cannot_listen(cfg.agent_listen, "agent_listen", exc) from None
    log.info("agent service listening", address=f"{host}:{bound}")
    sweeper = asyncio.create_task(_expire_silent_nodes(inventory), name="agentsvc-expire")
    try:
        yield bound
    finally:
        sweeper.cancel()
        await service.close()
        server.close()
        await handshakes.close()
        await asyncio.gather(sweeper, server.wait_closed(), return_exceptions=True)


def free_port(host: str) -> int:
    """A port nothing listens on now at host (the service binds it a moment later)."""
    family, _, _, _, address = socket.getaddrinfo(host, 0, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[
        0
    ]
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.bind(address)
        return int(probe.getsockname()[1])


class _TLSServer(Server):
    """grpclib's server, its connections upgraded to TLS by Handshakes (control/stream/handshake.py)."""

    def __init__(self, handlers: list[Any], handshakes: Handshakes) -> None:
        super().__init__(handlers)
        self._handshakes = handshakes

    def _protocol_factory(self) -> asyncio.Protocol:  # type: ignore[override]
        return self._handshakes.wrap(super()._protocol_factory)


async def _expire_silent_nodes(inventory: Inventory) -> None:
    # A quarter of the grace: a silent node leaves the routing table at most 25% late.
    period = min(max(inventory.grace_s / 4, 0.05), 1.0)
    while True:
        await asyncio.sleep(period)
        inventory.expire()


def _common_name(cert: dict[str, Any] | None) -> str:
    """The subject CN from ssl's getpeercert() dict: ((("commonName", "n1"),), ...)."""
    for rdn in (cert or {}).get("subject", ()):
        for key, value in rdn:
            if key == "commonName":
                return str(value)
    return ""
