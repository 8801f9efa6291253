"""Placement by the estimate from a model's headers where a profile states no min_memory_mb."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import structlog
from aiohttp import web
from aiohttp.test_utils import TestServer

from llmgw.adminapi.explain import explain_placement
from llmgw.catalog import Catalog
from llmgw.config import ModelConfig, ProfileConfig, ServerConfig
from llmgw.control.estimates import Estimates, Need
from llmgw.control.inventory import Inventory, Node
from llmgw.control.placement import Scheduler
from llmgw.control.reconciler import Reconciler
from llmgw.proto.llmgw import v1 as pb
from tests.capacity.models import Q, write_gguf, write_hf_directory

H100 = "h100-80g"


@pytest.fixture
async def weights(tmp_path: Path) -> AsyncIterator[str]:
    """A loopback server of a tiny GGUF (m.gguf) and a Hugging Face directory (hf/), Range and all."""
    write_gguf(tmp_path / "m.gguf")
    write_hf_directory(tmp_path / "hf")
    # llama.cpp models as the mirror holds them: a directory of GGUF files, one of them split in parts.
    (tmp_path / "split").mkdir()
    write_gguf(tmp_path / "split" / "m.gguf", split_max_tensors=8)
    (tmp_path / "split" / "README.md").write_text("a model card\n")
    (tmp_path / "two").mkdir()
    write_gguf(tmp_path / "two" / "m-q4.gguf", qtype=Q.Q8_0)
    write_gguf(tmp_path / "two" / "m-f16.gguf")

    async def serve(request: web.Request) -> web.StreamResponse:
        path = tmp_path / request.match_info["path"]
        if request.path.endswith("/") and path.is_dir():
            return web.json_response({"files": [{"path": p.name} for p in sorted(path.iterdir())]})
        if not path.is_file():
            raise web.HTTPNotFound()
        return web.FileResponse(path)

    app = web.Application()
    app.router.add_get("/{path:.*}", serve)
    async with TestServer(app, host="127.0.0.1", port=0) as server:
        yield str(server.make_url("/"))


def cpu_node(node_id: str, memory_mb: int) -> Node:
    return Node(
        id=node_id,
        engine_versions={"llamacpp": "b1"},
        engines_probed=True,
        memory=pb.Memory(total_mb=memory_mb, available_mb=memory_mb),
    )


def gpu_node(node_id: str, card_mb: int, used_mb: int = 0) -> Node:
    card = pb.Gpu(index=0, gpu_class=H100, healthy=True, memory_total_mb=card_mb, memory_used_mb=used_mb)
    return Node(
        id=node_id,
        engine_versions={"llamacpp": "b1"},
        engines_probed=True,
        gpus=[card],
        memory=pb.Memory(total_mb=64000, available_mb=64000),
    )


def model(source: str, **fields: object) -> ModelConfig:
    profile = ProfileConfig(name="p", engine="llamacpp", **fields)  # type: ignore[arg-type]
    return ModelConfig(name="tiny", source=source, profiles=[profile])


async def test_a_gguf_over_http_is_estimated_from_its_first_bytes(weights: str) -> None:
    estimates = Estimates()
    await estimates.refresh([model(weights + "m.gguf")])
    need = estimates.needs()[("tiny", "p")]
    # llama.cpp's 256 MiB of compute buffers is most of a tiny model's need.
    assert need.cards == 0 and 256 < need.share_mb < 400


async def test_a_directory_of_one_split_gguf_model_is_estimated_from_every_parts_first_bytes(
    weights: str,
) -> None:
    """A llama.cpp model on the mirror is a directory: its one model is read as its adapter picks it."""
    whole, split = Estimates(), Estimates()
    await whole.refresh([model(weights + "m.gguf")])
    await split.refresh([model(weights + "split/")])
    assert split.needs()[("tiny", "p")] == whole.needs()[("tiny", "p")]


async def test_a_directory_of_two_gguf_models_is_not_estimated_and_says_why(weights: str) -> None:
    estimates = Estimates()
    with structlog.testing.capture_logs() as logs:
        await estimates.refresh([model(weights + "two/")])
    assert estimates.needs() == {}
    [said] = [e for e in logs if e["event"] == "placing without a memory estimate"]
    assert "holds 2 GGUF models (m-f16.gguf, m-q4.gguf): llama.cpp loads one" in said["reason"]


async def test_a_hugging_face_directory_over_http_is_estimated_from_its_safetensors_headers(
    weights: str,
) -> None:
    estimates = Estimates()
    m = ModelConfig(name="tiny", source=weights + "hf/", profiles=[ProfileConfig(name="p", engine="vllm")])
    await estimates.refresh([m])
    assert estimates.needs()[("tiny", "p")].share_mb > 1024


async def test_a_node_too_small_for_the_estimate_is_not_a_candidate_and_the_reason_names_it(
    weights: str,
) -> None:
    m = model(weights + "m.gguf")
    estimates = Estimates()
    await estimates.refresh([m])
    nodes = [cpu_node("small", 200), cpu_node("big", 4000)]
    scheduler = Scheduler(nodes, [], [m], needs=estimates.needs())
    big, small = scheduler.explain(m)
    assert big.candidate
    assert not small.candidate
    assert "estimated from the model's headers" in small.reason
    assert small.reason.startswith("has too little memory (200 MB free of 200 MB, the model needs about ")
    placement = scheduler.place(m)
    assert placement is not None and placement.ranks[0].node == "big"


async def test_a_gpu_profile_needs_the_estimate_free_on_each_card(weights: str) -> None:
    m = model(weights + "m.gguf", gpu_class=H100)
    estimates = Estimates()
    await estimates.refresh([m])
    nodes = [gpu_node("busy", 80000, used_mb=79900), gpu_node("free", 80000)]
    scheduler = Scheduler(nodes, [], [m], needs=estimates.needs())
    busy, free = scheduler.explain(m)
    assert free.candidate
    assert "with the memory a replica needs" in busy.reason and "per card (estimated" in busy.reason


async def test_explain_and_the_unplaced_sentence_say_the_estimate(weights: str) -> None:
    cfg = ServerConfig(models=[model(weights + "m.gguf")])
    inventory = Inventory(grace_s=15)
    inventory.attach(
        pb.Register(
            node_id="n1",
            engine_versions={"llamacpp": "b1"},
            engines_probed=True,
            memory=pb.Memory(total_mb=100, available_mb=100),
        )
    )
    reconciler = Reconciler(cfg, inventory, Catalog(cfg), in_flight={})
    await reconciler.reconcile()
    assert inventory.replicas() == []
    why = inventory.why_no_ready("tiny")
    assert "has too little memory" in why and "estimated from the model's headers" in why
    [candidate] = explain_placement(cfg.models[0], inventory, cfg, cfg.models, None, reconciler.needs())
    assert "estimated from the model's headers" in candidate.reason


async def test_a_profile_with_min_memory_mb_keeps_using_it(weights: str) -> None:
    m = model(weights + "m.gguf", min_memory_mb=100)
    estimates = Estimates()
    await estimates.refresh([m])
    assert estimates.needs() == {}
    assert Scheduler([cpu_node("n1", 150)], [], [m], needs=estimates.needs()).place(m) is not None


async def test_a_model_whose_headers_cannot_be_read_places_as_before_and_says_so_once(weights: str) -> None:
    m = model(weights + "missing.gguf")
    estimates = Estimates()
    with structlog.testing.capture_logs() as logs:
        await estimates.refresh([m])
        await estimates.refresh([m])
    said = [e for e in logs if e["event"] == "placing without a memory estimate"]
    assert len(said) == 1 and "HTTP 404" in said[0]["reason"]
    assert estimates.needs() == {}
    assert Scheduler([cpu_node("n1", 100)], [], [m], needs=estimates.needs()).place(m) is not None


async def test_a_changed_definition_is_read_again() -> None:
    estimates = Estimates()
    m = model("")
    await estimates.refresh([m])
    assert estimates.needs() == {}
    # A need computed before is dropped with the model.
    estimates._needs[("tiny", "p")] = Need(total_bytes=1, cards=0, share_mb=1)
    await estimates.refresh([])
    assert estimates.needs() == {}
