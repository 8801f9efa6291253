"""Local sources served to nodes: the URL placement sends, and only the pinned files behind it."""

from __future__ import annotations

import hashlib
import socket
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import betterproto
import pytest

from llmgw.agent.weights import WeightsCache, WeightsError
from llmgw.catalog import Catalog
from llmgw.config import ServerConfig
from llmgw.control.inventory import Inventory
from llmgw.control.localfiles import LocalFiles, files_app, serve_local_files
from llmgw.control.reconciler import Reconciler
from llmgw.errors import LlmgwError
from llmgw.proto.llmgw import v1 as pb


@pytest.fixture
async def served(tmp_path: Path) -> AsyncIterator[tuple[Catalog, LocalFiles]]:
    catalog = Catalog(ServerConfig())
    cfg = ServerConfig(agent_listen="127.0.0.1:0", state_dir=str(tmp_path))
    async with serve_local_files(cfg, catalog) as files:
        yield catalog, files


def _directory(root: Path) -> Path:
    root.mkdir()
    (root / "config.json").write_text("{}")
    (root / "sub").mkdir()
    (root / "sub" / "model.safetensors").write_bytes(b"\1" * 1000)
    (root / "secret.txt").symlink_to("/etc/hostname")
    return root


class TestTheListener:
    async def test_a_gguf_file_is_served_at_the_url_placement_sends_with_its_pins(
        self, served: tuple[Catalog, LocalFiles], tmp_path: Path
    ):
        catalog, files = served
        weights = tmp_path / "tiny.gguf"
        weights.write_bytes(b"GGUF" * 1000)
        inventory = Inventory(grace_s=15)
        link = inventory.attach(
            pb.Register(node_id="n1", engine_versions={"llamacpp": "b1"}, engines_probed=True)
        )
        reconciler = Reconciler(ServerConfig(), inventory, catalog, in_flight={}, local_files=files)
        await catalog.add(f"name: tiny\nsource: {weights}\nprofiles:\n  - engine: llamacpp\n", "t.yaml")
        await reconciler.reconcile()
        kind, start = betterproto.which_one_of(link.outbox.get_nowait(), "kind")
        assert kind == "start" and isinstance(start, pb.StartShard)
        assert start.source.startswith(files.base_url + "/weights/tiny-") and start.source.endswith(
            "/tiny.gguf"
        )
        assert start.sha256 == {"tiny.gguf": hashlib.sha256(weights.read_bytes()).hexdigest()}
        async with WeightsCache(tmp_path / "cache") as cache:
            fetched = await cache.fetch(start.source, start.sha256)
        assert fetched.read_bytes() == weights.read_bytes()

    async def test_a_directory_is_listed_and_fetched_whole_by_a_node_without_its_links(
        self, served: tuple[Catalog, LocalFiles], tmp_path: Path
    ):
        catalog, files = served
        directory = _directory(tmp_path / "qwen")
        model, _ = await catalog.add(f"name: qwen\nsource: {directory}\nprofiles:\n  - engine: vllm\n", "q")
        url = files.url(model)
        assert url.endswith("/")
        async with WeightsCache(tmp_path / "cache") as cache:
            fetched = await cache.fetch(url, model.sha256)
        assert sorted(p.relative_to(fetched).as_posix() for p in fetched.rglob("*") if p.is_file()) == [
            ".complete.json",
            "config.json",
            "sub/model.safetensors",
        ]

    async def test_a_file_changed_since_it_was_added_is_refused_by_the_node(
        self, served: tuple[Catalog, LocalFiles], tmp_path: Path
    ):
        catalog, files = served
        weights = tmp_path / "tiny.gguf"
        weights.write_bytes(b"GGUF one")
        model, _ = await catalog.add(f"name: tiny\nsource: {weights}\nprofiles:\n  - engine: llamacpp\n", "t")
        weights.write_bytes(b"GGUF two")
        async with WeightsCache(tmp_path / "cache", attempts=1, retry_base_s=0.01) as cache:
            with pytest.raises(WeightsError, match="sha256"):
                await cache.fetch(files.url(model), model.sha256)

    async def test_nothing_but_the_pinned_files_of_a_catalog_model_is_served(
        self, served: tuple[Catalog, LocalFiles], tmp_path: Path
    ):
        catalog, files = served
        directory = _directory(tmp_path / "qwen")
        model, _ = await catalog.add(f"name: qwen\nsource: {directory}\nprofiles:\n  - engine: vllm\n", "q")
        base = files.url(model)
        async with aiohttp.ClientSession() as session:
            for path in ("secret.txt", "../qwen/config.json", "sub/../../etc/passwd"):
                async with session.get(base + path) as reply:
                    assert reply.status == 404, path
            async with session.get(f"{files.base_url}/weights/someone-else-0123456789ab/") as reply:
                assert reply.status == 404
            await catalog.remove("qwen")
            async with session.get(base + "config.json") as reply:
                assert reply.status == 404


class TestItsPort:
    """Nodes keep weights by URL: the port an empty weights_listen takes must not move at a restart."""

    async def test_the_free_port_taken_once_is_taken_again_at_the_next_start(self, tmp_path: Path):
        cfg = ServerConfig(agent_listen="127.0.0.1:0", state_dir=str(tmp_path))
        async with serve_local_files(cfg, Catalog(cfg)) as first:
            pass
        async with serve_local_files(cfg, Catalog(cfg)) as second:
            assert second.base_url == first.base_url

    async def test_a_kept_port_now_taken_gives_way_to_another(self, tmp_path: Path):
        cfg = ServerConfig(agent_listen="127.0.0.1:0", state_dir=str(tmp_path))
        async with serve_local_files(cfg, Catalog(cfg)) as first:
            pass
        port = int(first.base_url.rsplit(":", 1)[1])
        with socket.socket() as taken:
            taken.bind(("127.0.0.1", port))
            taken.listen()
            async with serve_local_files(cfg, Catalog(cfg)) as second:
                assert second.base_url != first.base_url
        assert (tmp_path / "weights-listen.port").read_text().strip() == second.base_url.rsplit(":", 1)[1]

    async def test_a_set_weights_listen_that_cannot_bind_is_said_naming_the_key(self, tmp_path: Path):
        with socket.socket() as taken:
            taken.bind(("127.0.0.1", 0))
            taken.listen()
            cfg = ServerConfig(weights_listen=f"127.0.0.1:{taken.getsockname()[1]}", state_dir=str(tmp_path))
            with pytest.raises(LlmgwError, match="weights_listen"):
                async with serve_local_files(cfg, Catalog(cfg)):
                    pass


def test_the_listener_has_no_route_but_the_listing_and_the_pinned_files():
    """Nothing here takes a body, or a number: a listing and a file, both by GET (and HEAD)."""
    app = files_app(Catalog(ServerConfig()))
    routes = {(r.method, r.resource.canonical) for r in app.router.routes() if r.resource is not None}
    assert routes == {
        ("GET", "/weights/{key}/"),
        ("HEAD", "/weights/{key}/"),
        ("GET", "/weights/{key}/{name}"),
        ("HEAD", "/weights/{key}/{name}"),
    }
