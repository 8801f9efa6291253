"""The admin API over a real loopback socket, on an inventory fed as agents feed it; its OpenAPI document."""

from __future__ import annotations

import asyncio
import io
import json
from collections.abc import AsyncIterator
from typing import Any

import jsonschema
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from openapi_spec_validator import validate

from llmgw.adminapi import auth, projections, views
from llmgw.adminapi import handlers as adminapi
from llmgw.agent.discovery.host import NO_AVX2_WARNING, Host
from llmgw.catalog import Catalog
from llmgw.config import ModelConfig, ProfileConfig, ServerConfig
from llmgw.control.inventory import Inventory
from llmgw.control.reconciler import Reconciler
from llmgw.proto.llmgw import v1 as pb
from llmgw.web.admin_listener import document

SIM = ModelConfig(name="sim-chat", replicas=1, profiles=[ProfileConfig(engine="sim")])
CFG = ServerConfig(models=[SIM], admin_tokens=[auth.hash_token("s3cret")])
ADDED = "name: sim-big\nprofiles:\n  - engine: sim\n"
YAML = {"Content-Type": "application/yaml"}
JSON = {"Content-Type": "application/json"}

# One reply of the API: the route as the document lists it, the status, and the JSON body.
Reply = tuple[str, str, int, Any]


def register(node_id: str, **fields: object) -> pb.Register:
    return pb.Register(node_id=node_id, engine_versions={"sim": "1"}, engines_probed=True, **fields)  # type: ignore[arg-type]


@pytest.fixture
def inventory() -> Inventory:
    inventory = Inventory(5.0, clock=lambda: 100.0)
    inventory.attach(
        register(
            "n1",
            gpus=[
                pb.Gpu(index=0, name="H100", gpu_class="h100-80g", healthy=True),
                pb.Gpu(index=1, name="H100", gpu_class="h100-80g", healthy=False, unhealthy_reason="XID 79"),
            ],
            memory=pb.Memory(total_mb=65536, available_mb=32768),
            running=[
                pb.ShardStatus(
                    shard_id="sim-chat-a",
                    model="sim-chat",
                    engine="sim",
                    state="ready",
                    endpoint="http://x:1",
                )
            ],
        ),
        "10.0.0.1:5000",
    )
    inventory.attach(pb.Register(node_id="n2"), "10.0.0.2:5000")
    return inventory


@pytest.fixture
async def client(inventory: Inventory) -> AsyncIterator[TestClient[web.Request, web.Application]]:
    app = web.Application()
    adminapi.install(app, CFG, inventory, Catalog(CFG))
    async with TestClient(TestServer(app)) as client:
        yield client


async def answer_logs(inventory: Inventory) -> None:
    """n1's agent, answering every request for its log as an agent does: a line saying what was asked."""
    link = inventory._links["n1"]
    while True:
        message = await link.outbox.get()
        if message.logs.request_id:
            inventory.logs.resolve(
                "n1",
                pb.LogsReply(
                    request_id=message.logs.request_id,
                    lines=[f"{message.logs.lines} lines of {message.logs.source}"],
                    sources=["agent", "sim-chat-a"],
                ),
            )


class TestViews:
    async def test_nodes_say_what_they_reported_and_null_for_what_they_did_not(self, client: TestClient):
        reply = await client.get("/api/v1/nodes")
        assert reply.status == 200
        n1, n2 = await reply.json()
        assert n1["gpus"] == {"total": 2, "free": 1, "healthy": 1}
        assert n1["memory"] == {"total_mb": 65536, "available_mb": 32768}
        assert n1["engines"] == ["sim"] and n1["models"] == ["sim-chat"] and n1["replicas"] == 1
        assert n1["unhealthy"] == ["GPU 1 (H100): XID 79"]
        assert n1["classes"] == ["h100-80g"]
        # Nothing reported is null, never a zero or an empty list that reads as "none".
        assert (n2["gpus"], n2["memory"], n2["disk"], n2["engines"]) == (None, None, None, None)

    async def test_a_node_installing_its_engine_on_a_slow_cpu_says_so_with_its_os(
        self, client: TestClient, inventory: Inventory
    ):
        host = Host(os_id="rocky", os_version="10.0", id_like=("rhel", "centos", "fedora"), arch="amd64")
        inventory.attach(
            register(
                "n3",
                host=host.to_proto(),
                warnings=host.warnings(),
                provision=[
                    pb.ProvisionStatus(
                        engine="llamacpp", version="b6500", state="installing", detail="installing libgomp"
                    ),
                    pb.ProvisionStatus(engine="vllm", state="unsupported", detail="install it by hand"),
                ],
                gpus=[pb.Gpu(index=0, name="L4", healthy=False, unhealthy_reason="XID 48")],
            )
        )
        reply = await client.get("/api/v1/nodes")
        n3 = (await reply.json())[2]
        assert n3["host"] == {
            "os_id": "rocky",
            "os_version": "10.0",
            "os_codename": "",
            "family": "rpm",
            "arch": "amd64",
            "cpu_flags": [],
            "nvidia_driver": "",
        }
        assert [(i["engine"], i["state"]) for i in n3["provision"]] == [
            ("llamacpp", "installing"),
            ("vllm", "unsupported"),
        ]
        assert n3["installs_not_ready"] == n3["provision"]
        assert n3["warnings"] == [NO_AVX2_WARNING]
        assert n3["unhealthy"] == ["GPU 0 (L4): XID 48"]
        # The view is what the OpenAPI document says a node is.
        document = await (await client.get("/api/v1/openapi.json")).json()
        schema = {**document["components"]["schemas"]["Node"], "components": document["components"]}
        jsonschema.validate(n3, schema)
        # A node without host discovery says nothing of its OS, rather than an empty one.
        assert (await reply.json())[1]["host"] is None

    async def test_an_install_that_becomes_ready_leaves_the_not_ready_list(
        self, client: TestClient, inventory: Inventory
    ):
        installing = pb.ProvisionStatus(engine="llamacpp", version="b6500", state="installing")
        inventory.attach(register("n3", provision=[installing]))
        ready = pb.ProvisionStatus(
            engine="llamacpp", version="b6500", state="ready", detail="llama-server b6500"
        )
        inventory.heartbeat("n3", pb.Heartbeat(provision_changed=True, provision=[ready]))
        n3 = (await (await client.get("/api/v1/nodes")).json())[2]
        assert n3["provision"][0]["detail"] == "llama-server b6500"
        assert n3["installs_not_ready"] == []

    async def test_status_counts_nodes_models_and_replicas(self, client: TestClient):
        status = await (await client.get("/api/v1/status")).json()
        assert status["nodes"]["total"] == 2 and status["nodes"]["ready"] == 2
        assert status["models"] == {"total": 1, "serving": 1}
        assert status["replicas"] == {"total": 1, "ready": 1}

    async def test_models_and_replicas_say_where_each_replica_runs(self, client: TestClient):
        (model,) = await (await client.get("/api/v1/models")).json()
        assert (model["name"], model["ready"], model["wanted"]) == ("sim-chat", 1, 1)
        (replica,) = await (await client.get("/api/v1/replicas?model=sim-chat")).json()
        assert (replica["node"], replica["state"]) == ("n1", "ready")

    async def test_explain_placement_says_per_node_why(self, client: TestClient):
        data = await (await client.get("/api/v1/explain-placement?model=sim-chat")).json()
        verdicts = {c["node"]: (c["candidate"], c["reason"]) for c in data["candidates"]}
        assert verdicts["n1"] == (True, "is a candidate")
        await client.post("/api/v1/nodes/n2/state", json={"state": "cordoned"})
        data = await (await client.get("/api/v1/explain-placement?model=sim-chat")).json()
        assert {c["node"]: c["reason"] for c in data["candidates"]}["n2"] == "is cordoned"

    async def test_explaining_a_model_not_in_the_catalog_is_a_404_naming_the_catalog(
        self, client: TestClient
    ):
        reply = await client.get("/api/v1/explain-placement?model=gpt-9")
        assert reply.status == 404
        assert (await reply.json())["error"] == "no model gpt-9 in the catalog; it has sim-chat"


class TestNodeState:
    async def test_a_cordoned_or_draining_node_gets_no_new_replica(
        self, client: TestClient, inventory: Inventory
    ):
        reply = await client.post("/api/v1/nodes/n1/state", json={"state": "cordoned"})
        assert reply.status == 200
        assert (await reply.json())["state"] == "cordoned"
        await client.post("/api/v1/nodes/n2/state", json={"state": "draining"})
        inventory.forget("sim-chat-a")
        await Reconciler(CFG, inventory, Catalog(CFG), in_flight={}).reconcile()
        assert inventory.replicas() == []
        await client.post("/api/v1/nodes/n1/state", json={"state": "ready"})
        await Reconciler(CFG, inventory, Catalog(CFG), in_flight={}).reconcile()
        assert [r.node_id for r in inventory.replicas()] == ["n1"]

    async def test_a_drained_node_keeps_its_state_when_it_reconnects(
        self, client: TestClient, inventory: Inventory
    ):
        await client.post("/api/v1/nodes/n1/state", json={"state": "draining"})
        inventory.attach(register("n1"))
        node = inventory.node("n1")
        assert node is not None and node.admin_state == "draining"

    async def test_an_unknown_state_is_refused_naming_the_known_ones(self, client: TestClient):
        reply = await client.post("/api/v1/nodes/n1/state", json={"state": "asleep"})
        assert reply.status == 400
        assert (await reply.json())["error"] == "state is 'asleep'; expected one of ready, cordoned, draining"

    async def test_a_form_post_is_refused_so_another_site_cannot_cordon_a_node(self, client: TestClient):
        reply = await client.post("/api/v1/nodes/n1/state", data={"state": "cordoned"})
        assert reply.status == 415

    async def test_an_unknown_node_is_a_404(self, client: TestClient):
        reply = await client.post("/api/v1/nodes/n9/state", json={"state": "cordoned"})
        assert reply.status == 404
        assert (await reply.json())["error"] == "no node n9 has registered"


class TestLogs:
    async def test_a_nodes_log_comes_back_with_its_sources(self, client: TestClient, inventory: Inventory):
        answering = asyncio.create_task(answer_logs(inventory))
        try:
            reply = await client.get("/api/v1/nodes/n1/logs?source=sim-chat-a&lines=100")
        finally:
            answering.cancel()
        assert reply.status == 200
        assert await reply.json() == {
            "node": "n1",
            "source": "sim-chat-a",
            "lines": ["100 lines of sim-chat-a"],
            "sources": ["agent", "sim-chat-a"],
            "error": "",
        }

    async def test_a_node_that_does_not_answer_is_a_504_saying_so(
        self, client: TestClient, inventory: Inventory
    ):
        inventory.logs.timeout_s = 0.05
        reply = await client.get("/api/v1/nodes/n2/logs")
        assert reply.status == 504
        assert (await reply.json())["error"] == "node n2 did not answer within 0.05 s"

    @pytest.mark.parametrize("lines", ["0", "2001", "many"])
    async def test_a_line_count_out_of_range_is_refused(self, client: TestClient, lines: str):
        reply = await client.get(f"/api/v1/nodes/n1/logs?lines={lines}")
        assert reply.status == 400
        assert "expected a whole number from 1 to 2000" in (await reply.json())["error"]

    async def test_logs_of_a_node_never_registered_are_a_404(self, client: TestClient):
        reply = await client.get("/api/v1/nodes/n9/logs")
        assert reply.status == 404


class TestOpenApi:
    async def test_the_document_is_valid_openapi_and_lists_every_route(self, client: TestClient):
        reply = await client.get("/api/v1/openapi.json")
        document = await reply.json()
        validate(document)
        listed = {(path, method.upper()) for path, item in document["paths"].items() for method in item}
        served = {
            (route.resource.canonical, route.method)
            for route in client.app.router.routes()
            if route.resource is not None and route.method != "HEAD"
        }
        assert served and served <= listed


@pytest.fixture
async def engine() -> AsyncIterator[str]:
    """An engine's endpoint whose /metrics answers as an engine's does."""

    async def metrics(request: web.Request) -> web.Response:
        return web.Response(text="llamacpp:requests_processing 1\n", content_type="text/plain")

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    async with TestServer(app, host="127.0.0.1") as server:
        yield str(server.make_url("")).rstrip("/")


async def _every_reply(client: TestClient[web.Request, web.Application], inventory: Inventory) -> list[Reply]:
    """A reply of every status of every route, asked as ctl and scripts ask."""
    replies: list[Reply] = []

    async def ask(method: str, route: str, url: str, **kwargs: Any) -> None:
        async with client.request(method, url, **kwargs) as reply:
            replies.append((method.lower(), route, reply.status, await reply.json()))

    await ask("GET", "/api/v1/status", "/api/v1/status")
    await ask("GET", "/api/v1/nodes", "/api/v1/nodes")
    logs = "/api/v1/nodes/{id}/logs"
    answering = asyncio.create_task(answer_logs(inventory))
    try:
        await ask("GET", logs, "/api/v1/nodes/n1/logs?lines=10")
    finally:
        answering.cancel()
    await ask("GET", logs, "/api/v1/nodes/n1/logs?lines=0")
    await ask("GET", logs, "/api/v1/nodes/n9/logs")
    await ask("GET", logs, "/api/v1/nodes/n3/logs")
    inventory.logs.timeout_s = 0.05
    await ask("GET", logs, "/api/v1/nodes/n2/logs")
    state = "/api/v1/nodes/{id}/state"
    await ask("POST", state, "/api/v1/nodes/n2/state", json={"state": "cordoned"})
    await ask("POST", state, "/api/v1/nodes/n2/state", json={"state": "asleep"})
    await ask("POST", state, "/api/v1/nodes/n9/state", json={"state": "cordoned"})
    await ask("POST", state, "/api/v1/nodes/n2/state", data={"state": "cordoned"})
    big = json.dumps({"state": "x" * (1024 * 1024)}).encode()
    await ask("POST", state, "/api/v1/nodes/n2/state", data=io.BytesIO(big), headers=JSON)
    await ask("GET", "/api/v1/models", "/api/v1/models")
    await ask("POST", "/api/v1/models", "/api/v1/models?file=big.yaml", data=ADDED, headers=YAML)
    await ask("POST", "/api/v1/models", "/api/v1/models?file=big.yaml", data=ADDED, headers=YAML)
    await ask("POST", "/api/v1/models", "/api/v1/models", data="name: [", headers=YAML)
    await ask(
        "POST", "/api/v1/models", "/api/v1/models", data=io.BytesIO(b"#" * (1024 * 1024 + 1)), headers=YAML
    )
    await ask(
        "POST", "/api/v1/models", "/api/v1/models", json={"name": "sim-chat", "profiles": [{"engine": "sim"}]}
    )
    await ask("POST", "/api/v1/models", "/api/v1/models", data=ADDED)
    model = "/api/v1/models/{name}"
    await ask("DELETE", model, "/api/v1/models/sim-big")
    await ask("DELETE", model, "/api/v1/models/sim-big")
    await ask("DELETE", model, "/api/v1/models/sim-chat")
    await ask("GET", "/api/v1/replicas", "/api/v1/replicas?model=sim-chat")
    await ask("GET", "/api/v1/replicas", "/api/v1/replicas?all=maybe")
    metrics = "/api/v1/replicas/{shard_id}/metrics"
    await ask("GET", metrics, "/api/v1/replicas/sim-chat-a/metrics")
    await ask("GET", metrics, "/api/v1/replicas/nope/metrics")
    await ask("GET", metrics, "/api/v1/replicas/sim-chat-b/metrics")
    explain = "/api/v1/explain-placement"
    await ask("GET", explain, "/api/v1/explain-placement?model=sim-chat")
    await ask("GET", explain, "/api/v1/explain-placement")
    await ask("GET", explain, "/api/v1/explain-placement?model=gpt-9")
    await ask("POST", "/api/v1/weights/collect", "/api/v1/weights/collect", json={})
    await ask("POST", "/api/v1/weights/collect", "/api/v1/weights/collect")
    await ask("GET", "/api/v1/openapi.json", "/api/v1/openapi.json")
    return replies


def _schema(doc: dict[str, Any], method: str, route: str, status: int) -> dict[str, Any] | None:
    """What the document says the reply holds; None for a reply it does not describe (the document itself)."""
    response = doc["paths"][route][method]["responses"][str(status)]
    content = response.get("content", {}).get("application/json")
    return None if content is None else {**content["schema"], "components": doc["components"]}


def _documented(doc: dict[str, Any]) -> set[tuple[str, str, int]]:
    """The replies of the routes adminapi serves; the tenancy routes have their own (test_tenancy.py)."""
    served = {route.path for route in adminapi.ROUTES}
    return {
        (method, route, int(status))
        for route, item in doc["paths"].items()
        if route.startswith("/api/") and route in served
        for method, operation in item.items()
        for status in operation["responses"]
    }


class TestEveryReplyIsWhatTheDocumentSays:
    """Against a fleet that reported everything a node can, and a real engine's metrics page."""

    @pytest.fixture
    def inventory(self, engine: str) -> Inventory:
        """A node that reported everything a node can, one that reported nothing, one whose stream is gone."""
        inventory = Inventory(5.0, clock=lambda: 100.0)
        host = Host(
            os_id="debian", os_version="12", os_codename="bookworm", id_like=("debian",), arch="amd64"
        )
        inventory.attach(
            pb.Register(
                node_id="n1",
                engine_versions={"sim": "1", "llamacpp": "b6500"},
                engines_probed=True,
                host=host.to_proto(),
                warnings=host.warnings(),
                gpus=[
                    pb.Gpu(index=0, name="H100", gpu_class="h100-80g", healthy=True),
                    pb.Gpu(
                        index=1, name="H100", gpu_class="h100-80g", healthy=False, unhealthy_reason="XID 79"
                    ),
                ],
                memory=pb.Memory(total_mb=65536, available_mb=32768),
                storage=[pb.Storage(path="/var/lib/llmgw", total_bytes=10**12, free_bytes=10**11)],
                provision=[pb.ProvisionStatus(engine="llamacpp", version="b6500", state="installing")],
                weights=[pb.Weights(source="http://m/old.gguf", path="/w/old.gguf", size_bytes=10)],
                running=[
                    pb.ShardStatus(
                        shard_id="sim-chat-a", model="sim-chat", engine="sim", state="ready", endpoint=engine
                    ),
                    pb.ShardStatus(shard_id="sim-chat-b", model="sim-chat", engine="sim", state="starting"),
                ],
            ),
            "10.0.0.1:5000",
        )
        inventory.attach(pb.Register(node_id="n2"), "10.0.0.2:5000")
        inventory.detach(inventory.attach(pb.Register(node_id="n3"), "10.0.0.3:5000"))
        return inventory

    async def test_every_status_of_every_route_is_asked_and_its_reply_validates(
        self, client: TestClient, inventory: Inventory
    ):
        doc = document("test")
        replies = await _every_reply(client, inventory)
        assert {(method, route, status) for method, route, status, _ in replies} == _documented(doc)
        for method, route, status, body in replies:
            schema = _schema(doc, method, route, status)
            if schema is None:
                validate(body)
                continue
            try:
                jsonschema.validate(body, schema)
            except jsonschema.ValidationError as exc:
                pytest.fail(f"{method.upper()} {route} {status} is not what the document says: {exc.message}")

    async def test_a_reply_with_a_field_more_or_less_than_its_view_does_not_validate(
        self, client: TestClient
    ):
        """What keeps the test above from passing when a view and the document part ways."""
        doc = document("test")
        schema = _schema(doc, "get", "/api/v1/nodes", 200)
        assert schema is not None
        (n1, *_) = await (await client.get("/api/v1/nodes")).json()
        jsonschema.validate([n1], schema)
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate([{**n1, "gpu_hours": 3}], schema)
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate([{k: v for k, v in n1.items() if k != "host"}], schema)
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate([{**n1, "state": "asleep"}], schema)


class TestTokens:
    def test_only_a_token_whose_digest_is_listed_is_allowed(self):
        hashes = [auth.hash_token("s3cret")]
        assert auth.token_allowed("Bearer s3cret", hashes)
        assert not auth.token_allowed("Bearer guess", hashes)
        assert not auth.token_allowed("s3cret", hashes)
        assert not auth.token_allowed(None, hashes)


async def test_a_long_node_list_is_written_a_piece_at_a_time_and_reads_as_one_list():
    inventory = Inventory(5.0, clock=lambda: 100.0)
    for i in range(2 * adminapi.NODES_PER_PIECE + 50):
        inventory.attach(register(f"n{i:04d}", memory=pb.Memory(total_mb=i, available_mb=i)), f"10.0.0.1:{i}")
    app = web.Application()
    adminapi.install(app, CFG, inventory, Catalog(CFG))
    async with TestClient(TestServer(app)) as client:
        reply = await client.get("/api/v1/nodes")
        assert reply.status == 200
        # Streamed, not built whole: no length known up front.
        assert reply.headers.get("Transfer-Encoding") == "chunked" and "Content-Length" not in reply.headers
        got = await reply.json()
    assert got == views.CONVERTER.unstructure(projections.nodes_view(inventory))


async def test_an_empty_node_list_is_an_empty_list():
    app = web.Application()
    adminapi.install(app, CFG, Inventory(5.0), Catalog(CFG))
    async with TestClient(TestServer(app)) as empty:
        reply = await empty.get("/api/v1/nodes")
        assert await reply.json() == []
