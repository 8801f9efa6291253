"""The weights' format, from their files' names, against the formats each engine module says it loads."""

from __future__ import annotations

from pathlib import Path
from unittest.mock import create_autospec

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from llmgw.adminapi import handlers as adminapi
from llmgw.catalog import Catalog
from llmgw.config import ModelConfig, ProfileConfig, ServerConfig
from llmgw.control.inventory import Inventory
from llmgw.control.mirror import MIRROR_CLIENT_KEY, MirrorClient, MirrorError, format_problem
from llmgw.weightsformat import engine_problem, format_of, serving


@pytest.mark.parametrize(
    ("names", "fmt"),
    [
        (["qwen2.5-0.5b-instruct-q4_k_m.gguf"], "gguf"),
        (["README.md", "model-00001-of-00002.gguf", "config.json"], "gguf"),
        (["config.json", "model.safetensors", "tokenizer.json"], "safetensors"),
        (["sub/config.json"], "safetensors"),
        (["README.md"], None),
    ],
)
def test_the_format_is_read_from_the_files_names(names: list[str], fmt: str | None):
    assert format_of(names) == fmt


def test_each_format_is_served_by_the_engines_whose_modules_declare_it():
    assert serving("gguf") == ["llamacpp", "vllm", "sglang"]
    assert serving("safetensors") == ["vllm", "sglang"]


def test_a_directory_for_llamacpp_names_the_engines_that_serve_it_and_what_llamacpp_needs():
    model = ModelConfig(
        name="qwen",
        source="mirror:Qwen/Qwen2.5-0.5B",
        profiles=[ProfileConfig(name="gpu", engine="vllm"), ProfileConfig(name="cpu", engine="llamacpp")],
    )
    assert engine_problem(model, "safetensors") == (
        1,
        "profile 'cpu' runs llamacpp, which does not load a Hugging Face safetensors directory "
        "(mirror:Qwen/Qwen2.5-0.5B); a Hugging Face safetensors directory: serve it with vllm or sglang; "
        "for llama.cpp, a GGUF file",
    )
    assert engine_problem(model, "gguf") is None


def test_the_sim_loads_no_weights_and_takes_any_source():
    model = ModelConfig(name="s", source="https://m.example/m.gguf", profiles=[ProfileConfig(engine="sim")])
    assert engine_problem(model, "safetensors") is None


class TestTheMirrorsFiles:
    async def test_a_mirror_model_holding_safetensors_is_refused_for_llamacpp(self):
        client = create_autospec(MirrorClient, instance=True)
        client.resolve.return_value = (
            "http://m/files/Qwen/Q/abc/",
            {"config.json": "a", "m.safetensors": "b"},
        )
        model = ModelConfig(name="q", source="mirror:Qwen/Q", profiles=[ProfileConfig(engine="llamacpp")])
        problem = await format_problem(client, model)
        assert problem is not None
        assert problem.startswith("q: profile 'default' runs llamacpp, which does not load a Hugging Face")

    async def test_a_model_the_mirror_does_not_hold_yet_is_not_refused_for_it(self):
        client = create_autospec(MirrorClient, instance=True)
        client.resolve.side_effect = MirrorError("the mirror does not hold Qwen/Q@main")
        model = ModelConfig(name="q", source="mirror:Qwen/Q", profiles=[ProfileConfig(engine="llamacpp")])
        assert await format_problem(client, model) is None


async def test_model_add_refuses_a_mirror_model_whose_files_its_engine_cannot_load(tmp_path: Path):
    client = create_autospec(MirrorClient, instance=True)
    client.resolve.return_value = ("http://m/files/Qwen/Q/abc/", {"config.json": "a", "m.safetensors": "b"})
    catalog = Catalog(ServerConfig())
    app = web.Application()
    adminapi.install(app, ServerConfig(), Inventory(5.0), catalog)
    app[MIRROR_CLIENT_KEY] = client
    async with TestClient(TestServer(app)) as http:
        reply = await http.post(
            "/api/v1/models?file=q.yaml",
            data="name: q\nsource: mirror:Qwen/Q\nprofiles:\n  - engine: llamacpp\n",
            headers={"Content-Type": "application/yaml"},
        )
        assert reply.status == 400
        assert (await reply.json())["error"].startswith(
            "q.yaml: q: profile 'default' runs llamacpp, which does not load a Hugging Face safetensors"
        )
    assert catalog.names() == []
