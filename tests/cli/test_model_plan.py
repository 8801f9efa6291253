"""`llmgw ctl model plan` on a real admin API on loopback: files read here, the fleet asked of it."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from click.testing import CliRunner

from llmgw.adminapi import capacity, handlers
from llmgw.adminapi.routes import mount
from llmgw.catalog import Catalog
from llmgw.cli.ctl import ctl
from llmgw.cli.exit import EXIT_ERROR, EXIT_NOT_FOUND, EXIT_USAGE
from llmgw.config import MirrorClientConfig, ModelConfig, ProfileConfig, ServerConfig
from llmgw.control.inventory import Inventory
from llmgw.control.mirror import MIRROR_CLIENT_KEY, MirrorClient, MirrorError
from llmgw.proto.llmgw import v1 as pb
from tests.capacity.models import Q, write_gguf, write_hf_directory


def fleet() -> Inventory:
    """A node with a free 80 GB card, one whose only card is nearly full, and one with RAM alone."""
    inventory = Inventory(5.0, clock=lambda: 1000.0)
    for node_id, used in (("big", 0), ("full", 81800)):
        card = pb.Gpu(index=0, gpu_class="h100-80g", memory_total_mb=81920, memory_used_mb=used, healthy=True)
        inventory.attach(
            pb.Register(node_id=node_id, gpus=[card], memory=pb.Memory(total_mb=65536, available_mb=60000)),
            "10.0.0.1:1",
        )
    inventory.attach(
        pb.Register(node_id="cpu", memory=pb.Memory(total_mb=4096, available_mb=1)), "10.0.0.2:1"
    )
    return inventory


@pytest.fixture
async def weights(tmp_path: Path) -> AsyncIterator[str]:
    """A loopback server of a tiny GGUF (w/m.gguf) and a Hugging Face directory (w/hf/), Range and all."""
    root = tmp_path / "w"
    root.mkdir()
    write_gguf(root / "m.gguf", qtype=Q.Q4_K)
    write_hf_directory(root / "hf")

    async def serve(request: web.Request) -> web.StreamResponse:
        path = root / request.match_info["path"]
        if request.path.endswith("/") and path.is_dir():
            return web.json_response({"files": [{"path": p.name} for p in sorted(path.iterdir())]})
        if not path.is_file():
            raise web.HTTPNotFound()
        return web.FileResponse(path)

    app = web.Application()
    app.router.add_get("/{path:.*}", serve)
    async with TestServer(app, host="127.0.0.1", port=0) as test_server:
        yield str(test_server.make_url("/"))


class HeldMirror(MirrorClient):
    """The mirror as the server resolves it: org/hf@main is the loopback server's hf/ directory."""

    def __init__(self, files: str) -> None:
        super().__init__(MirrorClientConfig())
        self._files = files

    async def resolve(self, source: str) -> tuple[str, dict[str, str]]:
        if source != "mirror:org/hf@main":
            raise MirrorError(f"{source}: the mirror does not hold it")
        return self._files + "hf/", {}


@pytest.fixture
async def server(tmp_path: Path, weights: str) -> AsyncIterator[tuple[str, Path]]:
    (gguf_path,) = write_gguf(tmp_path / "m.gguf", qtype=Q.Q4_K)
    cfg = ServerConfig(
        models=[
            ModelConfig(
                name="tiny",
                source=gguf_path.as_uri(),
                profiles=[
                    ProfileConfig(engine="llamacpp", name="gpu", gpu_class="h100-80g", args=["-c", "8192"]),
                    ProfileConfig(engine="llamacpp", name="cpu"),
                ],
            ),
            # Nothing listens on loopback port 9: the server's read is refused at once, and goes nowhere else.
            ModelConfig(name="far", source="http://127.0.0.1:9/m.gguf", profiles=[ProfileConfig()]),
            ModelConfig(
                name="served",
                source=weights + "m.gguf",
                profiles=[ProfileConfig(name="cpu", engine="llamacpp")],
            ),
            ModelConfig(name="gone", source=weights + "none.gguf", profiles=[ProfileConfig()]),
            ModelConfig(name="sim-chat", profiles=[ProfileConfig(engine="sim")]),
            ModelConfig(
                name="hf-cpu",
                source=weights + "hf/",
                profiles=[
                    ProfileConfig(
                        name="cpu",
                        engine="vllm",
                        env={"VLLM_CPU_KVCACHE_SPACE": "1", "HF_TOKEN": "hf_secret"},
                    )
                ],
            ),
        ]
    )
    app = web.Application()
    handlers.provide(app, cfg, fleet(), Catalog(cfg))
    app[MIRROR_CLIENT_KEY] = HeldMirror(weights)
    mount(app, capacity.ROUTES)
    async with TestServer(app) as test_server:
        yield str(test_server.make_url("")).rstrip("/"), gguf_path


async def run(*args: str) -> tuple[int, str, str]:
    result = await asyncio.to_thread(CliRunner().invoke, ctl, list(args), catch_exceptions=False)
    return result.exit_code, result.stdout, result.stderr


async def test_a_local_gguf_is_planned_against_every_node(server: tuple[str, Path]):
    url, path = server
    code, out, err = await run("--server", url, "model", "plan", str(path), "--context", "4096")
    assert (code, err) == (0, "")
    assert "Q4_K 100%" in out and "profile (any) (llamacpp)" in out
    assert out.endswith(
        "  needs 277.5 MB at context 4096 × 1; fits on big; cpu has 1.0 MB of RAM free; "
        "full has 125.8 MB free\n"
    )


async def test_json_carries_the_weights_and_the_cache_per_token_and_reads_back(server: tuple[str, Path]):
    url, path = server
    code, out, _ = await run("--server", url, "model", "plan", str(path), "--parallel", "2", "--json")
    plan = json.loads(out)
    assert code == 0
    assert plan["weights_bytes"] == sum(f["bytes"] for f in plan["files"])
    assert plan["kv_bytes_per_token"] == 2 * 4 * 64 * 2 * 2
    (fit,) = plan["profiles"]
    assert fit["estimate"]["kv_bytes"] == plan["kv_bytes_per_token"] * 2048 * 2
    assert {n["node"]: n["fits"] for n in fit["nodes"]} == {"big": True, "cpu": False, "full": False}


async def test_a_catalog_model_is_planned_per_profile_from_its_source(server: tuple[str, Path]):
    url, _ = server
    code, out, _ = await run("--server", url, "model", "plan", "tiny", "--json")
    plan = json.loads(out)
    assert code == 0
    assert [(p["profile"], p["estimate"]["context"]) for p in plan["profiles"]] == [
        ("gpu", 8192),
        ("cpu", 2048),
    ]
    gpu, cpu = plan["profiles"]
    assert [n["node"] for n in gpu["nodes"] if n["fits"]] == ["big"]
    assert [n["node"] for n in cpu["nodes"] if n["fits"]] == ["big", "full"]
    code, out, _ = await run("--server", url, "model", "plan", "tiny", "--profile", "cpu", "--json")
    assert [p["profile"] for p in json.loads(out)["profiles"]] == ["cpu"]


async def test_a_profile_the_model_lacks_is_refused_naming_those_it_has(server: tuple[str, Path]):
    code, _, err = await run("--server", server[0], "model", "plan", "tiny", "--profile", "h200")
    assert (code, err) == (EXIT_USAGE, "llmgw ctl: no profile h200; the model's profiles: gpu, cpu\n")


async def test_a_source_that_is_neither_here_nor_in_the_catalog_is_refused(server: tuple[str, Path]):
    code, _, err = await run("--server", server[0], "model", "plan", "/nowhere/m.gguf")
    assert code == EXIT_NOT_FOUND
    assert "neither a file or directory here nor a model in the catalog" in err


async def test_a_catalog_model_whose_files_are_elsewhere_says_where_to_run_it(server: tuple[str, Path]):
    code, _, err = await run("--server", server[0], "model", "plan", "far")
    assert code == EXIT_USAGE
    assert "is not a file or directory on this machine: run this where its files are" in err


async def test_a_truncated_file_is_refused_in_words(server: tuple[str, Path]):
    url, path = server
    path.write_bytes(path.read_bytes()[:100])
    code, _, err = await run("--server", url, "model", "plan", str(path))
    assert code == EXIT_ERROR
    assert "ends inside its GGUF header" in err


async def test_a_hugging_face_directory_is_planned_for_vllm(server: tuple[str, Path], tmp_path: Path):
    directory = write_hf_directory(tmp_path / "hf")
    code, out, _ = await run("--server", server[0], "model", "plan", str(directory), "--json")
    plan = json.loads(out)
    assert (code, plan["format"], plan["profiles"][0]["engine"]) == (0, "safetensors", "vllm")
    assert plan["profiles"][0]["estimate"]["kv_type"] == "bf16"


async def test_a_catalog_model_served_over_http_is_planned_from_the_headers_the_server_reads(
    server: tuple[str, Path],
):
    code, out, err = await run("--server", server[0], "model", "plan", "served", "--json")
    plan = json.loads(out)
    assert (code, err) == (0, "")
    assert plan["format"] == "gguf" and plan["files"][0]["quantisation"].startswith("Q4_K 100%")
    assert [p["profile"] for p in plan["profiles"]] == ["cpu"]
    assert {n["node"]: n["fits"] for n in plan["profiles"][0]["nodes"]} == {
        "big": True,
        "cpu": False,
        "full": True,
    }


async def test_a_model_on_the_mirror_is_planned_from_the_headers_the_server_reads(
    server: tuple[str, Path],
):
    code, out, err = await run("--server", server[0], "model", "plan", "org/hf@main", "--json")
    plan = json.loads(out)
    assert (code, err) == (0, "")
    assert (plan["format"], plan["profiles"][0]["engine"]) == ("safetensors", "vllm")


async def test_a_model_the_server_cannot_read_is_refused_with_the_readers_sentence(
    server: tuple[str, Path],
):
    code, _, err = await run("--server", server[0], "model", "plan", "gone")
    assert code == EXIT_USAGE
    assert "the server could not read its headers: " in err and "none.gguf answered HTTP 404" in err
    code, _, err = await run("--server", server[0], "model", "plan", "org/other@main")
    assert code == EXIT_USAGE
    assert "mirror:org/other@main: the mirror does not hold it" in err


async def test_the_capacity_route_reads_a_sources_shape_and_refuses_a_path(server: tuple[str, Path]):
    url = server[0] + "/api/v1/capacity"
    async with aiohttp.ClientSession() as session:
        async with session.get(url, params={"source": "mirror:org/hf@main"}) as response:
            body = await response.json()
        assert (response.status, body["shape"]["format"], body["shape_error"]) == (200, "safetensors", None)
        async with session.get(url, params={"source": "/etc/passwd"}) as response:
            assert response.status == 400
            assert "is not mirror:REPO@REVISION" in (await response.json())["error"]


async def test_a_catalog_model_without_weights_says_so_rather_than_reading_the_working_directory(
    server: tuple[str, Path],
):
    code, out, err = await run("--server", server[0], "model", "plan", "sim-chat")
    assert (code, out) == (EXIT_USAGE, "")
    assert err == "llmgw ctl: sim-chat has no weights to plan: the sim engine loads none\n"


async def test_a_model_read_by_the_server_is_named_by_its_source_not_where_its_headers_were_kept(
    server: tuple[str, Path], weights: str
):
    code, out, _ = await run("--server", server[0], "model", "plan", "served", "--json")
    plan = json.loads(out)
    assert code == 0
    assert (plan["source"], [f["path"] for f in plan["files"]]) == (weights + "m.gguf", [weights + "m.gguf"])
    code, out, _ = await run("--server", server[0], "model", "plan", "org/hf@main")
    assert code == 0 and "llmgw-headers" not in out
    assert out.startswith("model     mirror:org/hf@main (safetensors, LlamaForCausalLM)\n")


async def test_a_context_past_the_trained_one_is_warned_of_once(server: tuple[str, Path]):
    code, out, err = await run("--server", server[0], "model", "plan", "tiny", "--context", "8192")
    assert (code, err) == (0, "")
    # Both profiles are llama.cpp's: one sentence for the two.
    assert out.count("warning") == 1
    assert (
        "warning   --context 8192 is past the 2,048 tokens tiny was trained on: llama.cpp allocates "
        "the cache for all of it, but gives a sequence at most 2,048, and its answers that far are "
        "unreliable; the figures are for 8,192 all the same\n"
    ) in out
    code, out, _ = await run("--server", server[0], "model", "plan", "tiny", "--profile", "gpu", "--json")
    assert json.loads(out)["warnings"] == [
        "profile gpu's context of 8,192 tokens a sequence is past the 2,048 tokens tiny was trained on: "
        "llama.cpp allocates the cache for all of it, but gives a sequence at most 2,048, and its "
        "answers that far are unreliable; the figures are for 8,192 all the same"
    ]
    code, out, _ = await run("--server", server[0], "model", "plan", "tiny", "--context", "2048", "--json")
    assert json.loads(out)["warnings"] == []


async def test_a_vocabulary_file_is_refused_as_no_model(server: tuple[str, Path], tmp_path: Path):
    (vocab,) = write_gguf(tmp_path / "ggml-vocab-llama-spm.gguf", tensors=False)
    code, out, err = await run("--server", server[0], "model", "plan", str(vocab))
    assert (code, out) == (EXIT_ERROR, "")
    assert err.endswith(
        "ggml-vocab-llama-spm.gguf holds no tensors: it is a vocabulary or metadata file, not a model\n"
    )


async def test_a_vllm_profiles_set_cache_and_the_agents_sequences_are_planned(server: tuple[str, Path]):
    code, out, _ = await run("--server", server[0], "model", "plan", "hf-cpu", "--json")
    (fit,) = json.loads(out)["profiles"]
    assert code == 0
    # VLLM_CPU_KVCACHE_SPACE=1: 1 GiB of cache whatever the context; --max-num-seqs 4 from the agent.
    assert (fit["estimate"]["kv_bytes"], fit["estimate"]["parallel"]) == (1 << 30, 4)
    assert "its KV cache is set to 1.1 GB: 2,097,152 tokens" in fit["summary"]
    url = server[0] + "/api/v1/capacity"
    async with aiohttp.ClientSession() as session, session.get(url, params={"model": "hf-cpu"}) as response:
        text = await response.text()
    # Only the env that changes memory: a profile's env may hold tokens.
    assert json.loads(text)["model"]["profiles"][0]["env"] == {"VLLM_CPU_KVCACHE_SPACE": "1"}
    assert "hf_secret" not in text
