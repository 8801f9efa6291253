"""agent.yaml's `engines:` maps an engine kind the registry knows to its settings on this node."""

from __future__ import annotations

import pytest

from llmgw import config
from llmgw.config import AgentConfig, EngineOptions
from llmgw.errors import ConfigError


def test_a_file_in_the_earlier_shape_with_a_disabled_list_still_loads() -> None:
    cfg = config.parse(
        AgentConfig,
        "engines:\n"
        "  disabled: [vllm, sim]\n"
        "  llamacpp:\n"
        "    binary: /opt/llama/llama-server\n"
        "    parallel: 8\n"
        "  vllm:\n"
        "    binary: /opt/vllm/bin/vllm\n",
        "agent.yaml",
    )
    assert cfg.engine_options("llamacpp") == EngineOptions(binary="/opt/llama/llama-server", parallel=8)
    assert cfg.engine_options("vllm") == EngineOptions(binary="/opt/vllm/bin/vllm", disabled=True)
    assert cfg.engine_options("sim").disabled


def test_an_engine_the_file_does_not_name_has_the_defaults() -> None:
    cfg = config.parse(AgentConfig, "engines:\n  sglang: {disabled: true}\n", "agent.yaml")
    assert cfg.engine_options("vllm") == EngineOptions()
    assert cfg.engine_options("sglang").disabled


def test_an_engine_llmgw_does_not_know_is_refused_at_its_line_naming_the_known_ones() -> None:
    text = "node_id: n1\nengines:\n  llamacpp: {}\n  tgi:\n    binary: /opt/tgi\n"
    with pytest.raises(ConfigError) as err:
        config.parse(AgentConfig, text, "agent.yaml")
    assert str(err.value) == (
        "agent.yaml:4: 'engines.tgi' is not an engine llmgw knows; known engines: llamacpp, sglang, sim, vllm"
    )


def test_a_disabled_list_naming_an_unknown_engine_is_refused() -> None:
    with pytest.raises(ConfigError) as err:
        config.parse(AgentConfig, "engines:\n  disabled: [vlm]\n", "agent.yaml")
    assert "'engines.vlm' is not an engine llmgw knows" in str(err.value)
    assert "did you mean 'vllm'?" in str(err.value)


def test_a_disabled_that_is_not_a_list_says_what_it_takes() -> None:
    with pytest.raises(ConfigError) as err:
        config.parse(AgentConfig, "engines:\n  disabled: vllm\n", "agent.yaml")
    assert str(err.value).startswith("agent.yaml:2: 'engines.disabled' is not an engine llmgw knows")
    assert "`disabled: [vllm]`, or `vllm: {disabled: true}`" in str(err.value)


def test_the_settings_go_back_to_a_file_and_read_the_same() -> None:
    cfg = AgentConfig(engines={"llamacpp": EngineOptions(binary="/b", parallel=2, disabled=True)})
    assert config.parse(AgentConfig, config.dump(cfg), "agent.yaml") == cfg
