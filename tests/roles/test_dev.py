"""Dev mode told on its command line which engines to run or install, for this run only."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from llmgw.cli.main import main
from llmgw.errors import ConfigError
from llmgw.roles.dev import prepare_dev, with_engines

ROLES = ("server", "agent")


class TestWithEngines:
    def test_an_engine_binary_is_run_by_the_dev_node_and_the_files_stay_as_they_were(self, tmp_path: Path):
        binary = tmp_path / "llama-server"
        binary.write_text("#!/bin/sh\n")
        setup = with_engines(prepare_dev(tmp_path / "dev", ROLES), {"llamacpp": str(binary)}, {})
        assert setup.agent is not None and setup.agent.engines["llamacpp"].binary == str(binary)
        assert "llama-server" not in (tmp_path / "dev" / "agent.yaml").read_text()

    def test_an_install_without_a_version_takes_the_one_this_release_was_checked_against(
        self, tmp_path: Path
    ):
        setup = with_engines(prepare_dev(tmp_path / "dev", ROLES), {}, {"llamacpp": "", "vllm": "0.32.0"})
        assert setup.server is not None
        assert setup.server.engines == {"llamacpp": "b11434", "vllm": "0.32.0"}

    @pytest.mark.parametrize(
        ("binaries", "installs", "error"),
        [
            (
                {"llama": "/x"},
                {},
                "there is no engine called 'llama' to run or install (engines: llamacpp, sglang, vllm)",
            ),
            (
                {"llamacpp": "/nowhere/llama-server"},
                {},
                "--engine llamacpp=/nowhere/llama-server: no such file",
            ),
            (
                {},
                {"sglang": ""},
                "--install sglang: nodes cannot install sglang themselves; install it and run "
                "with --engine sglang=PATH",
            ),
        ],
    )
    def test_an_engine_that_cannot_be_had_is_refused_in_words(
        self, tmp_path: Path, binaries: dict[str, str], installs: dict[str, str], error: str
    ):
        with pytest.raises(ConfigError) as refused:
            with_engines(prepare_dev(tmp_path / "dev", ROLES), binaries, installs)
        assert str(refused.value) == error


class TestTheFlags:
    def test_engine_and_install_are_refused_without_dev(self):
        done = CliRunner().invoke(main, ["--role=agent", "--engine", "llamacpp=/bin/true"])
        assert done.exit_code == 2
        assert "--engine and --install are for --dev" in done.output

    def test_an_engine_without_its_path_says_the_form(self):
        done = CliRunner().invoke(main, ["--role=agent", "--dev", "--engine", "llamacpp"])
        assert done.exit_code == 2
        assert (
            "--engine 'llamacpp': write NAME=PATH, such as --engine llamacpp=/usr/local/bin/llama-server"
            in (done.output)
        )
