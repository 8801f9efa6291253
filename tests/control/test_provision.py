"""The Provision the control plane sends every node: which engines, at which versions, from where."""

from __future__ import annotations

import re
from pathlib import Path

from llmgw import config
from llmgw.config import EngineMirrorConfig, ServerConfig
from llmgw.control.stream.provision import DEFAULT_LLAMACPP_VERSION, provision_message, wanted_engines
from llmgw.proto.llmgw import v1 as pb

ROOT = Path(__file__).resolve().parents[2]


class TestWantedEngines:
    def test_unset_means_the_default_llamacpp_build(self) -> None:
        assert wanted_engines({}) == {"llamacpp": DEFAULT_LLAMACPP_VERSION}

    def test_a_version_in_server_yaml_replaces_the_default(self) -> None:
        assert wanted_engines({"llamacpp": "b9999", "vllm": "0.11"}) == {"llamacpp": "b9999", "vllm": "0.11"}

    def test_an_empty_version_removes_an_engine_the_default_included(self) -> None:
        assert wanted_engines({"llamacpp": ""}) == {}
        assert wanted_engines({"llamacpp": "  ", "vllm": "0.11"}) == {"vllm": "0.11"}

    def test_sim_is_never_asked_for(self) -> None:
        assert wanted_engines({"sim": "builtin", "llamacpp": ""}) == {}

    def test_an_empty_version_in_server_yaml_reaches_the_message_as_no_engine(self, tmp_path: Path) -> None:
        path = tmp_path / "server.yaml"
        path.write_text('engines:\n  llamacpp: ""\n')
        assert provision_message(config.load(ServerConfig, path).engines).engines == []


class TestTheDefaultBuild:
    def test_it_is_the_build_the_project_compiles_and_runs_end_to_end(self) -> None:
        """One build number: the default nodes install, the build script's and the end-to-end test's."""
        script = (ROOT / "scripts" / "build-llama-server.sh").read_text()
        built = re.search(r"^DEFAULT_VERSION=(\d+)$", script, re.M)
        e2e = re.search(
            r'^VERSION = "(\d+)"$', (ROOT / "tests" / "e2e" / "test_llamacpp.py").read_text(), re.M
        )
        assert built is not None and e2e is not None
        assert DEFAULT_LLAMACPP_VERSION == f"b{built[1]}" == f"b{e2e[1]}"

    def test_the_docs_name_it(self) -> None:
        for doc in ("reference.md", "provisioning.md"):
            text = (ROOT / "docs" / doc).read_text()
            assert f"llamacpp: {DEFAULT_LLAMACPP_VERSION}" in text, doc


class TestOfflineSites:
    def test_without_a_mirror_nodes_are_sent_no_source(self) -> None:
        message = provision_message({})
        assert (message.base_url, message.checksums) == ("", {})

    def test_server_yamls_mirror_and_checksums_are_sent_to_every_node(self, tmp_path: Path) -> None:
        path = tmp_path / "server.yaml"
        path.write_text(
            "engine_mirror:\n"
            "  base_url: https://mirror.example/engines\n"
            "  checksums:\n"
            f"    llama-{DEFAULT_LLAMACPP_VERSION}-bin-ubuntu-x64.tar.gz: sha256:{'ab' * 32}\n"
        )
        cfg = config.load(ServerConfig, path)

        message = provision_message(cfg.engines, cfg.engine_mirror)

        assert message == pb.Provision(
            engines=[pb.EngineWant(engine="llamacpp", version=DEFAULT_LLAMACPP_VERSION)],
            base_url="https://mirror.example/engines",
            checksums={f"llama-{DEFAULT_LLAMACPP_VERSION}-bin-ubuntu-x64.tar.gz": f"sha256:{'ab' * 32}"},
        )

    def test_a_mirror_is_optional_per_call(self) -> None:
        assert provision_message({}, EngineMirrorConfig()) == provision_message({})
