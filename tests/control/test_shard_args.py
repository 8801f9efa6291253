"""What a replica's engine is started with: an embeddings model's engine in its embedding mode."""

from __future__ import annotations

import pytest

from llmgw.config import ModelConfig, ProfileConfig
from llmgw.control.reconciler import shard_args
from llmgw.engines.base import LaunchSpec
from llmgw.engines.registry import ENGINES


@pytest.mark.parametrize(
    ("engine", "expected"),
    [
        ("llamacpp", ["--embeddings", "--threads", "2"]),
        ("vllm", ["--runner", "pooling", "--threads", "2"]),
        ("sglang", ["--is-embedding", "--threads", "2"]),
        ("sim", ["--threads", "2"]),
    ],
)
def test_an_embeddings_models_engine_is_told_to_serve_embeddings_before_the_profiles_args(
    engine: str, expected: list[str]
) -> None:
    profile = ProfileConfig(engine=engine, args=["--threads", "2"])
    assert shard_args(ModelConfig(name="e", kind="embeddings", profiles=[profile]), profile) == expected


@pytest.mark.parametrize(
    ("engine", "expected"),
    [("llamacpp", ["--reranking", "--threads", "2"]), ("sim", ["--threads", "2"])],
)
def test_a_rerank_models_engine_is_told_to_serve_rerank_before_the_profiles_args(
    engine: str, expected: list[str]
) -> None:
    profile = ProfileConfig(engine=engine, args=["--threads", "2"])
    assert shard_args(ModelConfig(name="r", kind="rerank", profiles=[profile]), profile) == expected


def test_a_chat_models_engine_gets_the_profiles_args_alone() -> None:
    profile = ProfileConfig(engine="llamacpp", args=["--threads", "2"])
    assert shard_args(ModelConfig(name="c", profiles=[profile]), profile) == ["--threads", "2"]


def test_a_profile_that_sets_the_mode_itself_is_not_given_it_twice() -> None:
    profile = ProfileConfig(engine="vllm", args=["--runner", "pooling", "--convert", "embed"])
    model = ModelConfig(name="e", kind="embeddings", profiles=[profile])
    assert shard_args(model, profile) == ["--runner", "pooling", "--convert", "embed"]


def test_llama_server_is_started_with_embeddings_on_its_command_line() -> None:
    profile = ProfileConfig(engine="llamacpp")
    args = shard_args(ModelConfig(name="e", kind="embeddings", profiles=[profile]), profile)
    argv = ENGINES["llamacpp"].command(
        LaunchSpec(model="e", port=1, model_path="/w/e.gguf", args=tuple(args))
    )
    assert "--embeddings" in argv
