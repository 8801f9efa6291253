"""The names a person chooses are checked where they come in, and encoded where they become a path."""

from __future__ import annotations

import urllib.parse
from pathlib import Path

import pytest

from llmgw import names
from llmgw.agent import state as engine_state

ALLOWED_MODELS = [
    "sim-chat",
    "org/model",
    "meta-llama/Llama-3.1-8B-Instruct",
    "Qwen/Qwen2.5-0.5B-Instruct",
    "llama3.1:8b",
    "ft:gpt-4o-mini:acme:custom:abc123",
    "a/b/c",
    "m" * 128,
]
REFUSED_MODELS = [
    "../../../escape",
    "org/../../escape",
    "..",
    ".hidden",
    "/etc/passwd",
    "org/",
    "org//model",
    "--help",
    "-m",
    "two\nlines",
    "with space",
    "tab\tname",
    "back\\slash",
    "q?x",
    "hash#x",
    "pct%2F",
    "",
    "m" * 129,
]


class TestModelNames:
    @pytest.mark.parametrize("name", ALLOWED_MODELS)
    def test_the_usual_model_names_are_allowed_hugging_face_s_org_model_too(self, name: str) -> None:
        assert names.model_name_problem(name) is None

    @pytest.mark.parametrize("name", REFUSED_MODELS)
    def test_a_name_that_could_climb_a_path_be_an_option_or_break_a_line_is_refused_saying_what_is_allowed(
        self, name: str
    ) -> None:
        problem = names.model_name_problem(name)
        assert problem is not None
        assert problem.startswith(f"the model name {name!r} is not allowed; a model name is letters, digits")
        assert "org/model" in problem


class TestShardFiles:
    @pytest.mark.parametrize(
        "shard_id",
        ["../../../escape-1a2b", "org/model-1a2b", "..", ".", "", "/etc/passwd", "a\x00b", "x/../../y"],
    )
    def test_a_shard_s_log_is_a_file_directly_in_the_log_directory_whatever_its_id(
        self, tmp_path: Path, shard_id: str
    ) -> None:
        path = engine_state.log_path(tmp_path, shard_id)
        assert path.parent == tmp_path / engine_state.LOG_DIR
        assert path.name.endswith(".log") and "/" not in path.name
        assert path.resolve().parent == (tmp_path / engine_state.LOG_DIR).resolve()

    def test_a_readable_shard_id_keeps_its_file_name(self, tmp_path: Path) -> None:
        """Logs written before ids were encoded are still found by the next agent."""
        assert engine_state.log_path(tmp_path, "sim-chat-1a2b3c4d").name == "sim-chat-1a2b3c4d.log"

    @pytest.mark.parametrize("text", ["org/model", "../x", "..", "a b", "ü/ö"])
    def test_an_encoded_file_name_reads_back_as_the_text_it_encodes(self, text: str) -> None:
        assert urllib.parse.unquote(names.file_name(text)) == text
        assert names.file_name(text) not in (".", "..") and "/" not in names.file_name(text)

    def test_an_org_model_s_shards_are_named_org_dash_dash_model(self) -> None:
        assert names.shard_stem("meta-llama/Llama-3.1-8B") == "meta-llama--Llama-3.1-8B"
        assert names.shard_stem("llama3.1:8b") == "llama3.1-8b"


class TestOtherNames:
    @pytest.mark.parametrize("node", ["gpu-01", "gpu-01.example", "n1", "N_1"])
    def test_host_names_are_node_ids(self, node: str) -> None:
        assert names.node_id_problem(node) is None

    @pytest.mark.parametrize("node", ["../n1", "n1/x", "n1\n", "-n1", ".n1", "", "n" * 64, "n 1"])
    def test_a_node_id_that_is_no_host_name_is_refused(self, node: str) -> None:
        assert (names.node_id_problem(node) or "").startswith(f"the node id {node!r} is not allowed")

    @pytest.mark.parametrize("name", ["default", "gpu", "h100-x8", "cpu_only"])
    def test_profile_names_are_plain_words(self, name: str) -> None:
        assert names.profile_name_problem(name) is None

    @pytest.mark.parametrize("name", ["../p", "a/b", "", "two\nlines", "p" * 65])
    def test_a_profile_name_that_is_not_a_plain_word_is_refused(self, name: str) -> None:
        assert (names.profile_name_problem(name) or "").startswith(
            f"the profile name {name!r} is not allowed"
        )
