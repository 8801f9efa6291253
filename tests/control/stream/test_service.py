"""The agent service over real mutual TLS on loopback, spoken to by a bare grpclib client."""

from __future__ import annotations

import asyncio
import gc
import socket
import ssl
import time
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path

import attrs
import pytest
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID
from grpclib.client import Channel, Stream
from grpclib.const import Cardinality, Status
from grpclib.encoding.base import CodecBase
from grpclib.exceptions import GRPCError, StreamTerminatedError

from llmgw import pki
from llmgw.config import ControlConfig, ServerConfig, TLSConfig
from llmgw.control.inventory import READY, UNREACHABLE, Inventory
from llmgw.control.records import Memory
from llmgw.control.stream.service import CONNECT, serve_agents
from llmgw.errors import LlmgwError
from llmgw.pki import client_ssl_context
from llmgw.proto.llmgw import v1 as pb

_Stream = Stream[pb.AgentMessage, pb.ControlMessage]


@asynccontextmanager
async def dial(port: int, tls: TLSConfig) -> AsyncIterator[_Stream]:
    channel = Channel("127.0.0.1", port, ssl=await asyncio.to_thread(client_ssl_context, tls))
    try:
        async with channel.request(
            CONNECT, Cardinality.STREAM_STREAM, pb.AgentMessage, pb.ControlMessage
        ) as s:
            yield s
            # Leaving a stream both sides still hold open is a cancellation, as far as grpclib is concerned.
            await s.cancel()
    finally:
        channel.close()


def register(node_id: str, **fields: object) -> pb.AgentMessage:
    return pb.AgentMessage(register=pb.Register(node_id=node_id, engine_versions={"sim": "1"}, **fields))


async def test_a_node_is_known_by_the_common_name_of_its_certificate(server_cfg, fleet):
    inventory = Inventory(server_cfg.control.grace_s)
    async with serve_agents(server_cfg, inventory) as port, dial(port, fleet.agents["n1"]) as stream:
        await stream.send_message(register("n1"))
        reply = await stream.recv_message()
        assert reply is not None and reply.ack.ref == "register" and reply.ack.ok
        node = inventory.node("n1")
        assert node is not None and node.state == READY and node.engine_versions == {"sim": "1"}


async def test_a_node_registering_as_another_is_refused_with_both_names(server_cfg, fleet):
    inventory = Inventory(server_cfg.control.grace_s)
    reasons: list[str] = []
    async with serve_agents(server_cfg, inventory, refused=reasons.append) as port:
        with pytest.raises(GRPCError) as refused:
            async with dial(port, fleet.agents["n1"]) as stream:
                await stream.send_message(register("n2"))
                await stream.recv_message()
    assert refused.value.status == Status.PERMISSION_DENIED
    assert refused.value.message == (
        "node n2 presented a certificate for n1: a node may only register as itself"
    )
    assert inventory.nodes() == []
    # What the metrics page counts the refusal as.
    assert reasons == ["wrong_node"]


async def test_a_certificate_whose_common_name_is_no_node_id_is_refused_saying_what_one_is(
    server_cfg, fleet, tmp_path
):
    """Signed by the right authority but not made by `llmgw cert` (which refuses such names)."""
    ca_dir = Path(fleet.server.ca).parent
    # pki's own issuing, past the check issue_agent makes: what another tool could have signed.
    cert, key = await asyncio.to_thread(
        pki._issue, ca_dir, "../n1", [x509.DNSName("n1")], ExtendedKeyUsageOID.CLIENT_AUTH, tmp_path / "x"
    )
    odd = TLSConfig(ca=fleet.server.ca, cert=str(cert), key=str(key))
    inventory = Inventory(server_cfg.control.grace_s)
    async with serve_agents(server_cfg, inventory) as port:
        with pytest.raises(GRPCError) as refused:
            async with dial(port, odd) as stream:
                await stream.send_message(register("../n1"))
                await stream.recv_message()
    assert refused.value.status == Status.PERMISSION_DENIED
    assert refused.value.message is not None
    assert refused.value.message.startswith(
        "the client certificate's common name cannot be a node: the node id '../n1' is not allowed"
    )
    assert inventory.nodes() == []


async def test_an_agent_whose_certificate_another_authority_signed_is_refused_at_tls(server_cfg, fleet):
    inventory = Inventory(server_cfg.control.grace_s)
    reasons: list[str] = []
    async with serve_agents(server_cfg, inventory, refused=reasons.append) as port:
        with pytest.raises(StreamTerminatedError):
            async with dial(port, fleet.stranger) as stream:
                await stream.send_message(register("n1"))
                await stream.recv_message()
    assert inventory.nodes() == []
    assert reasons == ["tls"]


async def test_a_client_without_a_certificate_is_refused_at_tls(server_cfg, fleet):
    inventory = Inventory(server_cfg.control.grace_s)
    bare = ssl.create_default_context(cafile=fleet.server.ca)
    bare.set_alpn_protocols(["h2"])
    async with serve_agents(server_cfg, inventory) as port:
        channel = Channel("127.0.0.1", port, ssl=bare)
        try:
            with pytest.raises(StreamTerminatedError):
                async with channel.request(
                    CONNECT, Cardinality.STREAM_STREAM, pb.AgentMessage, pb.ControlMessage
                ) as stream:
                    await stream.send_message(register("n1"))
                    await stream.recv_message()
        finally:
            channel.close()
    assert inventory.nodes() == []


async def test_a_second_stream_for_a_node_replaces_the_first(server_cfg, fleet, eventually):
    inventory = Inventory(server_cfg.control.grace_s)
    async with serve_agents(server_cfg, inventory) as port:
        with pytest.raises(GRPCError) as replaced:
            async with dial(port, fleet.agents["n1"]) as first:
                await first.send_message(register("n1"))
                assert (await first.recv_message()) is not None
                async with dial(port, fleet.agents["n1"]) as second:
                    await second.send_message(register("n1"))
                    assert (await second.recv_message()) is not None
                    # Every registration is followed by the engines the node should have.
                    provision = await second.recv_message()
                    assert provision is not None and provision.provision.engines
                    await inventory.send("n1", pb.ControlMessage(stop=pb.StopShard(shard_id="s1")))
                    reply = await second.recv_message()
                    assert reply is not None and reply.stop.shard_id == "s1"
                # Past its Provision, to the status that ends it.
                while (await first.recv_message()) is not None:
                    pass
        assert replaced.value.status == Status.ABORTED
        assert replaced.value.message == "node n1 opened a newer stream, which replaces this one"
        await eventually(lambda: not inventory.node("n1").connected)


async def test_a_silent_node_becomes_unreachable_and_its_replicas_stay_routed_until_their_engine_is_gone(
    server_cfg, fleet, eventually
):
    """The gateway reaches engines directly: a quiet agent alone does not take an answering engine away."""
    cfg = attrs.evolve(server_cfg, control=ControlConfig(grace_s=0.3))
    inventory = Inventory(cfg.control.grace_s)
    ready = pb.ShardStatus(
        shard_id="s1", model="sim-chat", engine="sim", state="ready", endpoint="http://127.0.0.1:1"
    )
    async with serve_agents(cfg, inventory) as port, dial(port, fleet.agents["n1"]) as stream:
        await stream.send_message(register("n1", running=[ready]))
        assert (await stream.recv_message()) is not None
        assert inventory.ready_endpoints("sim-chat") == ("http://127.0.0.1:1",)
        (replica,) = inventory.replicas("sim-chat")
        # The stream stays open, but the node says nothing past its grace.
        await eventually(lambda: inventory.node("n1").state == UNREACHABLE)
        assert inventory.ready_endpoints("sim-chat") == ("http://127.0.0.1:1",)
        assert inventory.agent_unreachable_s(replica) is not None
        await stream.send_message(pb.AgentMessage(heartbeat=pb.Heartbeat(sequence=1)))
        await eventually(lambda: inventory.agent_unreachable_s(replica) is None)
        assert inventory.ready_endpoints("sim-chat") == ("http://127.0.0.1:1",)
        # Quiet again, and this time the server's own check finds nothing answering there.
        await eventually(lambda: inventory.node("n1").state == UNREACHABLE)
        inventory.engine_gone("s1", "connection refused")
        assert inventory.ready_endpoints("sim-chat") == ()
        assert inventory.why_no_ready("sim-chat") == (
            "sim-chat has no ready replica: ready on n1, which is unreachable"
        )


async def test_shard_statuses_from_a_node_update_the_routing_table(server_cfg, fleet, eventually):
    inventory = Inventory(server_cfg.control.grace_s)
    async with serve_agents(server_cfg, inventory) as port, dial(port, fleet.agents["n1"]) as stream:
        await stream.send_message(register("n1"))
        assert (await stream.recv_message()) is not None
        status = pb.ShardStatus(shard_id="s1", model="sim-chat", engine="sim", state="starting")
        await stream.send_message(pb.AgentMessage(shard=status))
        await eventually(lambda: inventory.replicas("sim-chat"))
        assert inventory.why_no_ready("sim-chat").startswith(
            "sim-chat has no ready replica: starting on n1 for "
        )
        status.state, status.endpoint = "ready", "http://127.0.0.1:2"
        await stream.send_message(pb.AgentMessage(shard=status))
        await eventually(lambda: inventory.ready_endpoints("sim-chat") == ("http://127.0.0.1:2",))


async def test_the_agent_service_listens_where_agent_listen_says(server_cfg: ServerConfig):
    inventory = Inventory(server_cfg.control.grace_s)
    async with serve_agents(server_cfg, inventory) as port:
        assert port > 0


async def test_the_port_yielded_for_port_zero_is_the_one_it_listens_on_and_frees_on_leaving(
    server_cfg: ServerConfig,
):
    """The port comes from the socket llmgw bound, not from grpclib's private server."""
    inventory = Inventory(server_cfg.control.grace_s)
    async with serve_agents(server_cfg, inventory) as port:
        _, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.close()
        await writer.wait_closed()
    with socket.socket() as again:
        again.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        again.bind(("127.0.0.1", port))


async def test_an_agent_port_another_program_holds_is_refused_in_a_sentence(server_cfg: ServerConfig):
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        taken = f"127.0.0.1:{holder.getsockname()[1]}"
        cfg = attrs.evolve(server_cfg, agent_listen=taken)
        with pytest.raises(LlmgwError) as refused:
            async with serve_agents(cfg, Inventory(cfg.control.grace_s)):
                pass
    assert str(refused.value).startswith(f"cannot listen on {taken} (address already in use)")
    assert str(refused.value).endswith("change 'agent_listen'")


async def test_a_plain_heartbeat_updates_the_nodes_memory_and_keeps_it_reachable(
    server_cfg, fleet, eventually
):
    cfg = attrs.evolve(server_cfg, control=ControlConfig(grace_s=0.3))
    inventory = Inventory(cfg.control.grace_s)
    async with serve_agents(cfg, inventory) as port, dial(port, fleet.agents["n1"]) as stream:
        await stream.send_message(register("n1", memory=pb.Memory(total_mb=64_000, available_mb=60_000)))
        assert (await stream.recv_message()) is not None
        await eventually(lambda: inventory.node("n1").state == UNREACHABLE)
        beat = pb.Heartbeat(sequence=7, memory=pb.Memory(total_mb=64_000, available_mb=12_000))
        await stream.send_message(pb.AgentMessage(heartbeat=beat))
        await eventually(lambda: inventory.node("n1").state == READY)
        assert inventory.node("n1").memory == Memory(total_mb=64_000, available_mb=12_000)


async def test_a_heartbeat_before_register_is_refused(server_cfg, fleet):
    inventory = Inventory(server_cfg.control.grace_s)
    async with serve_agents(server_cfg, inventory) as port:
        with pytest.raises(GRPCError) as refused:
            async with dial(port, fleet.agents["n1"]) as stream:
                await stream.send_message(pb.AgentMessage(heartbeat=pb.Heartbeat(sequence=1)))
                while (await stream.recv_message()) is not None:
                    pass
        assert refused.value.status == Status.FAILED_PRECONDITION
        assert refused.value.message == "node n1 must register before it sends anything else"


async def test_heartbeats_sent_right_behind_the_register_before_its_ack_are_not_lost(
    server_cfg, fleet, eventually
):
    inventory = Inventory(server_cfg.control.grace_s)
    async with serve_agents(server_cfg, inventory) as port, dial(port, fleet.agents["n1"]) as stream:
        # In the same breath as the Register: they arrive with it, before the service reads it.
        await stream.send_message(register("n1", memory=pb.Memory(total_mb=64_000, available_mb=1)))
        for available in (2, 3, 4):
            beat = pb.Heartbeat(sequence=available, memory=pb.Memory(total_mb=64_000, available_mb=available))
            await stream.send_message(pb.AgentMessage(heartbeat=beat))
        assert (await stream.recv_message()) is not None
        await eventually(lambda: inventory.node("n1").memory == Memory(total_mb=64_000, available_mb=4))


async def test_a_second_register_on_one_stream_ends_it_saying_so(server_cfg, fleet):
    inventory = Inventory(server_cfg.control.grace_s)
    async with serve_agents(server_cfg, inventory) as port:
        with pytest.raises(GRPCError) as refused:
            async with dial(port, fleet.agents["n1"]) as stream:
                await stream.send_message(register("n1"))
                assert (await stream.recv_message()) is not None
                await stream.send_message(register("n1"))
                while (await stream.recv_message()) is not None:
                    pass
        assert refused.value.status == Status.FAILED_PRECONDITION
        assert refused.value.message == "node n1 registered twice on one stream"


class _Bytes(CodecBase):
    """Messages as the bytes given: what a node that is not an llmgw agent might send."""

    __content_subtype__ = "proto"

    def encode(self, message: object, message_type: object) -> bytes:
        return message if isinstance(message, bytes) else bytes(message)  # type: ignore[call-overload]

    def decode(self, data: bytes, message_type: object) -> bytes:
        return data


async def test_a_message_no_agent_would_send_ends_only_that_nodes_stream_in_a_sentence(
    server_cfg, fleet, eventually
):
    inventory = Inventory(server_cfg.control.grace_s)
    async with serve_agents(server_cfg, inventory) as port, dial(port, fleet.agents["n2"]) as healthy:
        await healthy.send_message(register("n2"))
        assert (await healthy.recv_message()) is not None
        context = await asyncio.to_thread(client_ssl_context, fleet.agents["n1"])
        channel = Channel("127.0.0.1", port, ssl=context, codec=_Bytes())
        try:
            with pytest.raises(GRPCError) as refused:
                async with channel.request(CONNECT, Cardinality.STREAM_STREAM, bytes, bytes) as stream:  # type: ignore[arg-type]
                    await stream.send_message(bytes(register("n1")))
                    assert (await stream.recv_message()) is not None
                    # A length-delimited field whose length never comes.
                    await stream.send_message(b"\x12\xff")
                    while (await stream.recv_message()) is not None:
                        pass
        finally:
            channel.close()
        assert refused.value.status == Status.INVALID_ARGUMENT
        assert refused.value.message == "a message of 2 bytes could not be read as one an llmgw agent sends"
        beat = pb.Heartbeat(sequence=1, memory=pb.Memory(total_mb=8, available_mb=7))
        await healthy.send_message(pb.AgentMessage(heartbeat=beat))
        await eventually(lambda: inventory.node("n2").memory == Memory(total_mb=8, available_mb=7))


@pytest.fixture(scope="module")
def forty_nodes(fleet, tmp_path_factory) -> dict[str, TLSConfig]:
    ca = Path(fleet.server.ca).parent
    out = tmp_path_factory.mktemp("forty")
    nodes = {}
    for i in range(40):
        cert, key = pki.issue_agent(ca, f"g{i:02d}", out)
        nodes[f"g{i:02d}"] = TLSConfig(ca=fleet.server.ca, cert=str(cert), key=str(key))
    return nodes


async def test_a_heartbeat_leaves_nothing_alive_for_the_garbage_collector_to_walk(
    server_cfg, forty_nodes, eventually
):
    """Each node's heartbeat once left a dozen objects alive until its next one (a chain of
    coroutines waiting for it, and a new record of its memory): at 10,000 nodes, collections
    walking them held the loop 100-280 ms."""
    inventory = Inventory(server_cfg.control.grace_s)
    memory = pb.Memory(total_mb=64_000, available_mb=60_000)
    async with serve_agents(server_cfg, inventory) as port, AsyncExitStack() as stack:
        streams = [await stack.enter_async_context(dial(port, tls)) for tls in forty_nodes.values()]
        for node, stream in zip(forty_nodes, streams, strict=True):
            await stream.send_message(register(node, memory=memory))
            assert (await stream.recv_message()) is not None

        async def beat_all(sequence: int) -> None:
            before = time.monotonic()
            # Available memory moves with every heartbeat, as a live node's does.
            moved = pb.Memory(total_mb=64_000, available_mb=60_000 - sequence)
            for stream in streams:
                await stream.send_message(
                    pb.AgentMessage(heartbeat=pb.Heartbeat(sequence=sequence, memory=moved))
                )
            await eventually(lambda: all(inventory.node(n).last_seen > before for n in forty_nodes))

        await beat_all(1)
        gc.collect()
        gc.freeze()
        try:
            await beat_all(2)
            gc.collect()
            # Only what is not frozen: what was made since, and is still alive.
            alive = len(gc.get_objects())
        finally:
            gc.unfreeze()
    assert alive < len(forty_nodes), f"{alive} objects made by {len(forty_nodes)} heartbeats are still alive"


class TestVersions:
    async def test_an_agent_older_than_the_window_is_refused_saying_to_upgrade_it(self, server_cfg, fleet):
        inventory = Inventory(server_cfg.control.grace_s)
        reasons: list[str] = []
        async with serve_agents(server_cfg, inventory, refused=reasons.append, version="0.11.0") as port:
            with pytest.raises(GRPCError) as refused:
                async with dial(port, fleet.agents["n1"]) as stream:
                    await stream.send_message(register("n1", agent_version="0.9.0"))
                    await stream.recv_message()
        assert refused.value.status == Status.FAILED_PRECONDITION
        assert refused.value.message == (
            "node n1: agent 0.9.0 is older than this server accepts (0.10–0.12): "
            "upgrade it (docs/operations.md, Versions)"
        )
        assert inventory.nodes() == [] and reasons == ["version"]

    async def test_an_agent_newer_than_the_window_is_refused_saying_to_upgrade_the_server_first(
        self, server_cfg, fleet
    ):
        inventory = Inventory(server_cfg.control.grace_s)
        async with serve_agents(server_cfg, inventory, version="0.11.0") as port:
            with pytest.raises(GRPCError) as refused:
                async with dial(port, fleet.agents["n1"]) as stream:
                    await stream.send_message(register("n1", agent_version="0.13.0"))
                    await stream.recv_message()
        assert refused.value.message == (
            "node n1: agent 0.13.0 is newer than this server accepts (0.10–0.12): upgrade the server first"
        )
        assert inventory.nodes() == []

    @pytest.mark.parametrize("agent_version", ["0.10.3", "0.11.0", "0.12.1", ""])
    async def test_an_agent_inside_the_window_or_silent_about_its_version_is_acked_with_the_servers(
        self, server_cfg, fleet, agent_version: str
    ):
        inventory = Inventory(server_cfg.control.grace_s)
        async with serve_agents(server_cfg, inventory, version="0.11.0") as port:
            async with dial(port, fleet.agents["n1"]) as stream:
                await stream.send_message(register("n1", agent_version=agent_version))
                reply = await stream.recv_message()
            assert reply is not None and reply.ack.ok and reply.ack.server_version == "0.11.0"
            node = inventory.node("n1")
            assert node is not None and node.agent_version == agent_version
