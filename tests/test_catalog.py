"""The live catalog: server.yaml's models on every start, ctl's kept in the store, bad ones refused."""

from __future__ import annotations

import hashlib
import io
from collections.abc import AsyncIterator
from pathlib import Path

import betterproto
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from llmgw.adminapi import auth
from llmgw.adminapi import handlers as adminapi
from llmgw.catalog import Catalog, DeclaredModel, UnknownModel, parse_model
from llmgw.config import ModelConfig, ProfileConfig, ServerConfig
from llmgw.control.inventory import Inventory, Link
from llmgw.control.reconciler import Reconciler
from llmgw.errors import ConfigError
from llmgw.gateway.app import make_gateway_app
from llmgw.gateway.auth import KeyCache
from llmgw.proto.llmgw import v1 as pb
from llmgw.routes import EngineRoute
from llmgw.store import open_store
from llmgw.store.catalog import list_models, put_model

DECLARED = ModelConfig(name="sim-chat", profiles=[ProfileConfig(engine="sim")])
CFG = ServerConfig(models=[DECLARED], admin_tokens=[auth.hash_token("s3cret")])

PIN = "4c1f0e2b9a7d3c5e8f6a1b2c3d4e5f60718293a4b5c6d7e8f9a0b1c2d3e4f5a6"
BIG = f"""\
name: sim-big
version: "2"
replicas: 2
source: https://models.example/sim-big/
sha256:
  weights.gguf: {PIN}
profiles:
  - name: gpu
    engine: sim
    gpu_class: h100-80g
    gpus_per_node: 2
    nodes: 1
    min_memory_mb: 65536
    labels: {{zone: eu}}
    args: [--ctx-size, "8192"]
    env: {{CUDA_MODULE_LOADING: LAZY}}
  - name: cpu
    engine: sim
fallbacks: [sim-chat]
pricing:
  prompt_per_1k: 0.5
  completion_per_1k: 1.5
"""


def _sent(link: Link) -> list[tuple[str, object]]:
    out = []
    while not link.outbox.empty():
        out.append(betterproto.which_one_of(link.outbox.get_nowait(), "kind"))
    return out


class TestTheCatalog:
    async def test_models_declared_in_server_yaml_are_there_on_every_start(self, tmp_path: Path):
        for _ in range(2):
            async with open_store(tmp_path / "llmgw.db") as store:
                catalog = await Catalog.open(CFG, store)
                assert catalog.names() == ["sim-chat"]
                assert catalog.origin("sim-chat") == "server.yaml"

    async def test_a_model_added_while_running_is_kept_over_a_restart_with_all_it_said(self, tmp_path: Path):
        async with open_store(tmp_path / "llmgw.db") as store:
            catalog = await Catalog.open(CFG, store)
            model, replaced = await catalog.add(BIG, "big.yaml")
            assert not replaced
            assert catalog.names() == ["sim-chat", "sim-big"]
        async with open_store(tmp_path / "llmgw.db") as store:
            again = await Catalog.open(CFG, store)
        kept = again.get("sim-big")
        assert kept == model
        assert kept is not None
        assert (kept.version, kept.replicas, kept.source) == ("2", 2, "https://models.example/sim-big/")
        assert kept.sha256 == {"weights.gguf": PIN}
        assert kept.profiles == [
            ProfileConfig(
                name="gpu",
                engine="sim",
                gpu_class="h100-80g",
                gpus_per_node=2,
                nodes=1,
                min_memory_mb=65536,
                labels={"zone": "eu"},
                args=["--ctx-size", "8192"],
                env={"CUDA_MODULE_LOADING": "LAZY"},
            ),
            ProfileConfig(name="cpu", engine="sim"),
        ]
        assert kept.fallbacks == ["sim-chat"]
        assert kept.pricing is not None and kept.pricing.completion_per_1k == 1.5
        assert again.origin("sim-big") == "ctl"

    async def test_a_removed_model_stays_removed_after_a_restart(self, tmp_path: Path):
        async with open_store(tmp_path / "llmgw.db") as store:
            catalog = await Catalog.open(CFG, store)
            await catalog.add(BIG, "big.yaml")
            await catalog.remove("sim-big")
        async with open_store(tmp_path / "llmgw.db") as store:
            assert (await Catalog.open(CFG, store)).names() == ["sim-chat"]

    async def test_adding_a_model_of_the_same_name_again_replaces_it(self):
        catalog = Catalog(CFG)
        await catalog.add(BIG, "big.yaml")
        model, replaced = await catalog.add(BIG.replace("replicas: 2", "replicas: 3"), "big.yaml")
        assert replaced and model.replicas == 3
        assert catalog.names() == ["sim-chat", "sim-big"]

    @pytest.mark.parametrize(
        ("text", "error"),
        [
            (
                "name: m\nprofiles:\n  - engine: sim\nreplica: 2\n",
                "big.yaml:4: unknown key 'replica'; did you mean 'replicas'?",
            ),
            (
                "name: m\nreplicas: two\nprofiles:\n  - engine: sim\n",
                "big.yaml:2: 'replicas' is 'two'; expected a whole number",
            ),
            (
                "name: m\nprofiles:\n  - engine: sim\n  - engine: vlm\n    name: b\n",
                "big.yaml:4: 'profiles[1].engine' is 'vlm'; expected one of llamacpp, sglang, sim, vllm",
            ),
            ("name: m\nreplicas: 1\n", "big.yaml: m has no profile; add one under 'profiles'"),
            ("replicas: 1\nprofiles:\n  - engine: sim\n", "big.yaml: the model has no 'name'"),
            (
                "name: m\nreplicas: -1\nprofiles:\n  - engine: sim\n",
                "big.yaml:2: 'replicas' is -1; expected 0 or more",
            ),
            (
                "name: m\nprofiles:\n  - engine: sim\nfallbacks:\n  - other\n  - m\n",
                "big.yaml:6: m cannot be its own fallback",
            ),
            (
                "name: m\nprofiles:\n  - engine: sim\npricing:\n  prompt_per_1k: free\n",
                "big.yaml:5: 'pricing.prompt_per_1k' is 'free'; expected a number",
            ),
            ("name: m\nprofiles: [engine: sim\n", "big.yaml:3: not valid YAML"),
            (
                "name: m\nsource: models/m.gguf\nprofiles:\n  - engine: sim\n",
                "big.yaml:2: 'source' is 'models/m.gguf'; expected a file or directory on the server "
                "(/srv/models/model.gguf, file:///srv/models/Qwen2.5-0.5B), `mirror:ORG/MODEL[@REVISION]` "
                "for a model on the mirror, or the http:// or https:// URL of a file, or of a directory "
                "ending in '/'",
            ),
            (
                "name: m\nsource: /srv/models/nowhere.gguf\nprofiles:\n  - engine: llamacpp\n",
                "big.yaml: m's source: /srv/models/nowhere.gguf does not exist on the server",
            ),
            (
                "name: m\nsource: /srv/../etc/m.gguf\nprofiles:\n  - engine: llamacpp\n",
                "big.yaml:2: 'source' is '/srv/../etc/m.gguf'; a path on the server must be absolute, "
                "without '..'",
            ),
            (
                "name: m\nsource: https://m.example/qwen/model.safetensors\nprofiles:\n"
                "  - engine: llamacpp\n",
                "big.yaml:4: profile 'default' runs llamacpp, which does not load a Hugging Face "
                "safetensors directory (https://m.example/qwen/model.safetensors); a Hugging Face "
                "safetensors directory: serve it with vllm or sglang; for llama.cpp, a GGUF file",
            ),
            (
                "name: m\nsource: https://models.example\nprofiles:\n  - engine: sim\n",
                "big.yaml:2: 'source' is 'https://models.example', which names no file; "
                "a directory's URL must end in '/'",
            ),
            (
                "name: m\nsource: https://m.example/m.gguf\nsha256:\n  m.gguf: 4c1f\n"
                "profiles:\n  - engine: sim\n",
                "big.yaml:4: 'sha256.m.gguf' is '4c1f'; expected 64 hexadecimal digits",
            ),
            (
                "name: m\nsha256:\n  m.gguf: " + "a" * 64 + "\nprofiles:\n  - engine: sim\n",
                "big.yaml:2: m pins a sha256 but has no 'source' to check it against",
            ),
            (
                "name: m\nprofiles:\n  - engine: sim\n    gpus_per_node: -2\n",
                "big.yaml:4: 'profiles[0].gpus_per_node' is -2; expected 0 or more",
            ),
            (
                "name: m\nprofiles:\n  - engine: llamacpp\n    args: [-c, 4096, --port, 8080]\n",
                "big.yaml:4: 'profiles[0].args': the agent chooses the port from agent.yaml's "
                "engine_ports; remove --port 8080 from args",
            ),
            (
                "name: m\nprofiles:\n  - engine: sim\n    args: [--host=0.0.0.0]\n",
                "big.yaml:4: 'profiles[0].args': the agent chooses the address the engine listens on "
                "(agent.yaml's engine_bind); remove --host=0.0.0.0 from args",
            ),
            (
                # The secret is not repeated back.
                "name: m\nprofiles:\n  - engine: vllm\n    args: [--api-key, sekrit]\n",
                "big.yaml:4: 'profiles[0].args': the agent gives each replica a secret of its own, "
                "which only the gateway holds; remove --api-key from args",
            ),
            (
                "name: m\nprofiles:\n  - engine: llamacpp\n    args: [--api-key-file, /k]\n",
                "big.yaml:4: 'profiles[0].args': the agent gives each replica a secret of its own, "
                "which only the gateway holds; remove --api-key-file from args",
            ),
        ],
    )
    async def test_a_bad_definition_is_refused_with_what_is_wrong_and_where(self, text: str, error: str):
        catalog = Catalog(CFG)
        with pytest.raises(ConfigError) as refused:
            await catalog.add(text, "big.yaml")
        assert str(refused.value).startswith(error)
        assert catalog.names() == ["sim-chat"]

    async def test_a_name_server_yaml_declares_can_be_neither_shadowed_nor_removed(self):
        catalog = Catalog(CFG)
        with pytest.raises(DeclaredModel, match=r"sim-chat is declared in server\.yaml; change it there"):
            await catalog.add("name: sim-chat\nprofiles:\n  - engine: sim\n", "mine.yaml")
        with pytest.raises(DeclaredModel, match=r"sim-chat is declared in server\.yaml; remove it there"):
            await catalog.remove("sim-chat")
        assert catalog.get("sim-chat") is DECLARED

    async def test_removing_a_model_nobody_added_says_which_were(self):
        catalog = Catalog(CFG)
        await catalog.add(BIG, "big.yaml")
        with pytest.raises(
            UnknownModel, match=r"no model nope was added with ctl \(added with ctl: sim-big\)"
        ):
            await catalog.remove("nope")

    async def test_a_stored_model_this_release_cannot_read_is_skipped_and_the_rest_serve(
        self, tmp_path: Path
    ):
        async with open_store(tmp_path / "llmgw.db") as store:
            await put_model(store, "old", "name: old\nretired_key: 1\n", "old.yaml")
            await put_model(store, "sim-big", BIG, "big.yaml")
            assert (await Catalog.open(CFG, store)).names() == ["sim-chat", "sim-big"]

    async def test_a_stored_model_server_yaml_now_declares_yields_to_server_yaml(self, tmp_path: Path):
        async with open_store(tmp_path / "llmgw.db") as store:
            await put_model(
                store, "sim-chat", "name: sim-chat\nreplicas: 9\nprofiles:\n  - engine: sim\n", "x"
            )
            catalog = await Catalog.open(CFG, store)
        assert catalog.get("sim-chat") is DECLARED


class TestNames:
    async def test_a_name_that_climbs_out_of_a_directory_is_refused_at_the_door_with_file_and_line(self):
        catalog = Catalog(CFG)
        with pytest.raises(ConfigError) as refused:
            await catalog.add("profiles:\n  - engine: sim\nname: ../../../escape\n", "escape.yaml")
        assert str(refused.value) == (
            "escape.yaml:3: the model name '../../../escape' is not allowed; a model name is letters, "
            "digits and . _ - :, in parts separated by single '/' (org/model), each part starting with "
            "a letter or digit, at most 128 characters"
        )
        assert catalog.names() == ["sim-chat"]

    async def test_a_stored_model_whose_name_is_no_longer_allowed_is_not_served_but_can_be_removed(
        self, tmp_path: Path
    ):
        """Added before names were checked: it must not reach a node, and ctl must still take it out."""
        async with open_store(tmp_path / "llmgw.db") as store:
            await put_model(
                store, "../../../escape", "name: ../../../escape\nprofiles: [{engine: sim}]\n", "x"
            )
            catalog = await Catalog.open(CFG, store)
            assert catalog.names() == ["sim-chat"]
            assert await catalog.remove("../../../escape") == "../../../escape"
            assert await list_models(store) == []
            with pytest.raises(UnknownModel):
                await catalog.remove("../../../escape")

    async def test_an_org_model_s_replicas_get_shard_ids_without_a_slash(self):
        inventory = Inventory(grace_s=15)
        link = inventory.attach(pb.Register(node_id="n1", engine_versions={"sim": "1"}, engines_probed=True))
        catalog = Catalog(ServerConfig())
        reconciler = Reconciler(ServerConfig(), inventory, catalog, in_flight={})
        await catalog.add("name: meta-llama/Llama-3.1-8B\nprofiles:\n  - engine: sim\n", "m.yaml")
        await reconciler.reconcile()
        ((kind, start),) = _sent(link)
        assert (kind, start.model) == ("start", "meta-llama/Llama-3.1-8B")
        assert start.shard_id.startswith("meta-llama--Llama-3.1-8B-") and "/" not in start.shard_id


class TestTheReconcilerSeesIt:
    async def test_a_model_added_is_placed_and_one_removed_is_stopped(self):
        inventory = Inventory(grace_s=15)
        link = inventory.attach(pb.Register(node_id="n1", engine_versions={"sim": "1"}, engines_probed=True))
        catalog = Catalog(ServerConfig())
        reconciler = Reconciler(ServerConfig(), inventory, catalog, in_flight={})
        inventory.changed.clear()
        await catalog.add("name: added\nprofiles:\n  - engine: sim\n", "added.yaml")
        # The reconciler's wait wakes at once rather than at its next interval.
        assert inventory.changed.is_set()
        await reconciler.reconcile()
        ((kind, start),) = _sent(link)
        assert (kind, start.model) == ("start", "added")
        await catalog.remove("added")
        await reconciler.reconcile()
        ((kind, stop),) = _sent(link)
        assert (kind, stop.shard_id, stop.reason) == (
            "stop",
            start.shard_id,
            "added is no longer in the catalog",
        )


@pytest.fixture
async def admin(tmp_path: Path) -> AsyncIterator[tuple[TestClient[web.Request, web.Application], Catalog]]:
    async with open_store(tmp_path / "llmgw.db") as store:
        catalog = await Catalog.open(CFG, store)
        app = web.Application()
        adminapi.install(app, CFG, Inventory(5.0), catalog)
        async with TestClient(TestServer(app)) as client:
            yield client, catalog


class TestTheAdminApi:
    async def test_a_model_posted_as_yaml_is_added_listed_and_then_removed(self, admin):
        client, catalog = admin
        reply = await client.post(
            "/api/v1/models?file=big.yaml", data=BIG, headers={"Content-Type": "application/yaml"}
        )
        assert reply.status == 201
        assert (await reply.json())["name"] == "sim-big"
        listed = await (await client.get("/api/v1/models")).json()
        assert [m["name"] for m in listed] == ["sim-chat", "sim-big"]
        status = await (await client.get("/api/v1/status")).json()
        assert status["models"]["total"] == 2
        again = await client.post("/api/v1/models", data=BIG, headers={"Content-Type": "application/yaml"})
        assert again.status == 200
        gone = await client.delete("/api/v1/models/sim-big")
        assert gone.status == 200 and await gone.json() == {"name": "sim-big", "removed": True}
        assert catalog.names() == ["sim-chat"]

    async def test_a_model_posted_as_json_is_added_and_a_name_with_a_slash_removed(self, admin):
        client, catalog = admin
        definition = {"name": "meta-llama/Llama-3.1-8B", "profiles": [{"engine": "sim"}]}
        reply = await client.post("/api/v1/models", json=definition)
        assert reply.status == 201
        explained = await client.get("/api/v1/explain-placement", params={"model": "meta-llama/Llama-3.1-8B"})
        assert explained.status == 200
        assert (await client.delete("/api/v1/models/meta-llama/Llama-3.1-8B")).status == 200
        assert catalog.names() == ["sim-chat"]

    async def test_a_bad_definition_is_a_400_naming_the_file_line_and_key(self, admin):
        client, _ = admin
        reply = await client.post(
            "/api/v1/models?file=big.yaml",
            data="name: m\nprofiles:\n  - engine: sim\n    gpus: 2\n",
            headers={"Content-Type": "application/yaml"},
        )
        assert reply.status == 400
        assert (await reply.json())["error"] == (
            "big.yaml:4: unknown key 'profiles[0].gpus'; did you mean 'gpu_class'?"
        )

    async def test_server_yaml_s_models_are_a_409_and_unknown_ones_a_404(self, admin):
        client, _ = admin
        shadow = await client.post(
            "/api/v1/models", json={"name": "sim-chat", "profiles": [{"engine": "sim"}]}
        )
        assert shadow.status == 409
        assert "declared in server.yaml" in (await shadow.json())["error"]
        assert (await client.delete("/api/v1/models/sim-chat")).status == 409
        assert (await client.delete("/api/v1/models/nope")).status == 404

    async def test_a_definition_of_nested_aliases_is_a_400_at_its_line_and_adds_nothing(self, admin):
        client, catalog = admin
        laughs = (
            'name: lol\nprofiles: [{engine: sim}]\na: &a ["lol","lol","lol","lol","lol","lol"]\n'
            + "".join(
                f"{n}: &{n} [{','.join([f'*{p}'] * 9)}]\n"
                for p, n in zip("abcdefgh", "bcdefghi", strict=True)
            )
        )
        reply = await client.post(
            "/api/v1/models?file=lol.yaml", data=laughs, headers={"Content-Type": "application/yaml"}
        )
        assert reply.status == 400
        assert (await reply.json())[
            "error"
        ] == "lol.yaml:7: uses more than 32 aliases (*name); write the values out"
        assert catalog.names() == ["sim-chat"]

    async def test_a_definition_over_one_mib_is_a_413_in_the_api_s_shape(self, admin):
        client, catalog = admin
        reply = await client.post(
            "/api/v1/models",
            data=io.BytesIO(b"#" * (1024 * 1024 + 1)),
            headers={"Content-Type": "application/yaml"},
        )
        assert reply.status == 413
        assert await reply.json() == {"error": "a model's definition is at most 1,048,576 bytes"}
        assert catalog.names() == ["sim-chat"]

    async def test_a_definition_sent_as_a_form_or_plain_text_is_refused(self, admin):
        client, _ = admin
        reply = await client.post("/api/v1/models", data=BIG, headers={"Content-Type": "text/plain"})
        assert reply.status == 415


class TestTheGatewaySeesIt:
    async def test_v1_models_and_routing_follow_the_catalog(self):
        catalog = Catalog(CFG)

        class NoReplicas:
            def ready_endpoints(self, model: str) -> list[str]:
                return []

            def why_no_ready(self, model: str) -> str:
                return f"{model} has no ready replica: no replica has been placed yet"

            def route(self, endpoint: str) -> EngineRoute | None:
                return None

        cfg = ServerConfig(models=[DECLARED], auth=CFG.auth.__class__(enabled=False))
        app = make_gateway_app(cfg, catalog, NoReplicas(), KeyCache())
        async with TestClient(TestServer(app)) as client:
            ask = {"model": "sim-big", "messages": []}
            assert (await client.post("/v1/chat/completions", json=ask)).status == 404
            await catalog.add(BIG, "big.yaml")
            listed = await (await client.get("/v1/models")).json()
            assert [m["id"] for m in listed["data"]] == ["sim-chat", "sim-big"]
            # Known now: no longer "does not exist", but waiting for a replica.
            reply = await client.post("/v1/chat/completions", json=ask)
            assert reply.status == 503
            await catalog.remove("sim-big")
            listed = await (await client.get("/v1/models")).json()
            assert [m["id"] for m in listed["data"]] == ["sim-chat"]


class TestSeveralControlPlanes:
    async def test_a_model_added_or_removed_on_one_control_plane_reaches_the_others_catalog(
        self, postgres_url: str
    ) -> None:
        """The leader must place a model added on a standby, and every gateway route to it."""
        async with open_store(postgres_url) as one, open_store(postgres_url) as other:
            first, second = await Catalog.open(CFG, one), await Catalog.open(CFG, other)
            heard: list[int] = []
            second.subscribe(lambda: heard.append(second.generation))
            await first.add(BIG, "big.yaml")
            assert await second.reload()
            assert second.get("sim-big") == first.get("sim-big")
            assert heard, "the reconciler hears of it at once"
            # Nothing changed: nothing is parsed again, no listener is told.
            told = len(heard)
            assert not await second.reload()
            assert len(heard) == told
            assert not await first.reload()

            await first.add(BIG.replace("replicas: 2", "replicas: 3"), "big.yaml")
            assert await second.reload()
            big = second.get("sim-big")
            assert big is not None and big.replicas == 3

            await second.remove("sim-big")
            assert await first.reload()
            assert first.names() == ["sim-chat"]


def _hf_directory(root: Path) -> Path:
    """A Hugging Face directory as a download leaves it: config.json, safetensors, a hidden cache."""
    root.mkdir()
    (root / "config.json").write_text('{"architectures": ["LlamaForCausalLM"]}')
    (root / "model.safetensors").write_bytes(b"\0" * 64)
    (root / ".cache").mkdir()
    (root / ".cache" / "lock").write_text("")
    return root


class TestLocalSources:
    """A file or directory on the server's disk as a model's source, pinned when it is added."""

    async def test_a_gguf_file_on_the_servers_disk_is_added_with_its_sha256_pinned(self, tmp_path: Path):
        weights = tmp_path / "tiny.gguf"
        weights.write_bytes(b"GGUF" + b"\1" * 100)
        catalog = Catalog(CFG)
        text = f"name: tiny\nsource: {weights}\nprofiles:\n  - engine: llamacpp\n"
        model, _ = await catalog.add(text, "tiny.yaml")
        assert model.sha256 == {"tiny.gguf": hashlib.sha256(weights.read_bytes()).hexdigest()}

    async def test_the_pins_are_kept_with_the_definition_so_a_changed_file_is_not_pinned_again(
        self, tmp_path: Path
    ):
        weights = tmp_path / "tiny.gguf"
        weights.write_bytes(b"GGUF one")
        first = hashlib.sha256(b"GGUF one").hexdigest()
        async with open_store(tmp_path / "llmgw.db") as store:
            catalog = await Catalog.open(CFG, store)
            await catalog.add(f"name: tiny\nsource: file://{weights}\nprofiles:\n  - engine: llamacpp\n", "t")
        weights.write_bytes(b"GGUF two")
        async with open_store(tmp_path / "llmgw.db") as store:
            again = await Catalog.open(CFG, store)
        kept = again.get("tiny")
        assert kept is not None and kept.sha256 == {"tiny.gguf": first}

    async def test_a_hugging_face_directory_is_pinned_file_by_file_without_its_hidden_files(
        self, tmp_path: Path
    ):
        directory = _hf_directory(tmp_path / "Qwen2.5-0.5B")
        catalog = Catalog(CFG)
        model, _ = await catalog.add(f"name: qwen\nsource: {directory}\nprofiles:\n  - engine: vllm\n", "q")
        assert sorted(model.sha256) == ["config.json", "model.safetensors"]

    async def test_a_hugging_face_directory_for_llamacpp_is_refused_naming_the_engines_that_serve_it(
        self, tmp_path: Path
    ):
        directory = _hf_directory(tmp_path / "Qwen2.5-0.5B")
        catalog = Catalog(CFG)
        with pytest.raises(ConfigError) as refused:
            await catalog.add(f"name: qwen\nsource: {directory}\nprofiles:\n  - engine: llamacpp\n", "q.yaml")
        assert str(refused.value) == (
            f"q.yaml: qwen: profile 'default' runs llamacpp, which does not load a Hugging Face safetensors "
            f"directory ({directory}); a Hugging Face safetensors directory: serve it with vllm or sglang; "
            "for llama.cpp, a GGUF file"
        )
        assert catalog.names() == ["sim-chat"]

    async def test_pins_stated_with_a_local_source_must_be_the_files_own(self, tmp_path: Path):
        weights = tmp_path / "tiny.gguf"
        weights.write_bytes(b"GGUF")
        text = (
            f"name: tiny\nsource: {weights}\nsha256:\n  tiny.gguf: {PIN}\nprofiles:\n  - engine: llamacpp\n"
        )
        with pytest.raises(ConfigError, match=r"tiny: tiny\.gguf's sha256 is [0-9a-f]{64}, not the"):
            await Catalog(CFG).add(text, "t.yaml")

    async def test_a_local_source_in_server_yaml_is_pinned_when_the_server_starts(self, tmp_path: Path):
        weights = tmp_path / "tiny.gguf"
        weights.write_bytes(b"GGUF")
        declared = ModelConfig(name="tiny", source=str(weights), profiles=[ProfileConfig(engine="llamacpp")])
        async with open_store(tmp_path / "llmgw.db") as store:
            catalog = await Catalog.open(ServerConfig(models=[declared]), store)
        model = catalog.get("tiny")
        assert model is not None and model.sha256 == {"tiny.gguf": hashlib.sha256(b"GGUF").hexdigest()}


class TestScale:
    @pytest.mark.parametrize(
        ("text", "said"),
        [
            (
                "name: tiny\nprofiles: [{engine: sim}]\nscale: {min: 2, max: 1}\n",
                "model.yaml:3: tiny's scale.max (1) is below its scale.min (2)",
            ),
            (
                "name: tiny\nreplicas: 2\nprofiles: [{engine: sim}]\nscale: {min: 0, max: 2}\n",
                "model.yaml:2: tiny has both 'replicas' and 'scale'",
            ),
        ],
    )
    def test_a_scale_that_contradicts_itself_or_replicas_is_refused_naming_its_line(
        self, text: str, said: str
    ) -> None:
        with pytest.raises(ConfigError) as refused:
            parse_model(text, "model.yaml")
        assert str(refused.value).startswith(said)

    def test_an_on_demand_model_is_read_with_its_scale(self) -> None:
        model = parse_model(
            "name: tiny\nprofiles: [{engine: sim}]\nscale: {min: 0, max: 3, idle_s: 300}\n", "model.yaml"
        )
        assert model.scale is not None and (model.scale.min, model.scale.max, model.scale.idle_s) == (
            0,
            3,
            300,
        )
