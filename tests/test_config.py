"""server.yaml and agent.yaml: read, refused with file/line/key, and documented."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from llmgw import config
from llmgw.config import AgentConfig, MirrorConfig, ServerConfig
from llmgw.errors import ConfigError

REFERENCE = Path(__file__).parent.parent / "docs" / "reference.md"


class TestLoading:
    def test_a_valid_server_file_is_structured_into_its_classes(self) -> None:
        cfg = config.parse(
            ServerConfig,
            "listen: 0.0.0.0:8080\nauth:\n  enabled: false\nmodels:\n"
            "  - name: sim-chat\n    replicas: 2\n    profiles:\n      - engine: sim\n        args: [--x]\n",
        )
        assert cfg.listen == "0.0.0.0:8080"
        assert cfg.auth.enabled is False
        assert cfg.models[0].replicas == 2
        assert cfg.models[0].profiles[0].args == ["--x"]

    def test_an_empty_file_means_every_default(self) -> None:
        assert config.parse(AgentConfig, "") == AgentConfig()

    def test_an_unknown_key_is_refused_with_the_nearest_known_key(self) -> None:
        with pytest.raises(ConfigError) as err:
            config.parse(ServerConfig, "auth:\n  enabeld: true\n", "server.yaml")
        assert str(err.value) == "server.yaml:2: unknown key 'auth.enabeld'; did you mean 'enabled'?"

    def test_a_wrong_type_names_file_line_key_and_what_was_expected(self) -> None:
        text = "listen: 127.0.0.1:8080\nmodels:\n  - name: x\n    replicas: two\n"
        with pytest.raises(ConfigError) as err:
            config.parse(ServerConfig, text, "/etc/llmgw/server.yaml")
        assert str(err.value) == (
            "/etc/llmgw/server.yaml:4: 'models[0].replicas' is 'two'; expected a whole number"
        )

    def test_a_yes_no_field_refuses_a_string(self) -> None:
        with pytest.raises(ConfigError, match=r"agent.yaml:1: 'heartbeat_interval_s' is 'fast'"):
            config.parse(AgentConfig, "heartbeat_interval_s: fast\n", "agent.yaml")

    def test_broken_yaml_is_refused_with_its_line(self) -> None:
        with pytest.raises(ConfigError, match=r"^server.yaml:2: not valid YAML"):
            config.parse(ServerConfig, "listen: x\n  enabled: true\n", "server.yaml")

    def test_a_missing_file_says_it_cannot_be_read(self, tmp_path: Path) -> None:
        with pytest.raises(ConfigError, match="cannot be read"):
            config.load(ServerConfig, tmp_path / "nope.yaml")

    def test_what_dump_writes_parses_back_to_the_same_value(self) -> None:
        cfg = config.parse(ServerConfig, "models:\n  - name: m\n    profiles: [{engine: sim}]\n")
        assert config.parse(ServerConfig, config.dump(cfg)) == cfg


class TestReference:
    @pytest.mark.parametrize("cls", [ServerConfig, AgentConfig, MirrorConfig])
    def test_every_key_is_documented_in_the_reference(self, cls: type) -> None:
        text = REFERENCE.read_text(encoding="utf-8")
        documented = set(re.findall(r"^\| `([^`]+)` \|", text, flags=re.MULTILINE))
        missing = [key for key, _ in config.documented_keys(cls) if key not in documented]
        assert missing == [], f"docs/reference.md lacks {missing}"

    @pytest.mark.parametrize("cls", [ServerConfig, AgentConfig, MirrorConfig])
    def test_every_key_carries_help(self, cls: type) -> None:
        assert [key for key, help in config.documented_keys(cls) if not help] == []


class TestAcrossHosts:
    def test_an_advertise_address_that_is_not_this_machines_is_refused_with_file_line_and_key(self) -> None:
        with pytest.raises(ConfigError) as err:
            config.parse(AgentConfig, "node_id: n1\nadvertise_address: 203.0.113.77\n", "agent.yaml")
        assert str(err.value).startswith(
            "agent.yaml:2: 'advertise_address' is '203.0.113.77'; it is not an address of this machine "
            "(its addresses: "
        )

    def test_a_fabric_address_and_an_engine_bind_are_held_to_the_same(self) -> None:
        with pytest.raises(ConfigError, match=r"^agent.yaml:1: 'fabric_address' is 'ib0';"):
            config.parse(AgentConfig, "fabric_address: ib0\n", "agent.yaml")
        with pytest.raises(ConfigError, match=r"^agent.yaml:1: 'engine_bind' is '203.0.113.77'; it is not"):
            config.parse(AgentConfig, "engine_bind: 203.0.113.77\n", "agent.yaml")

    @pytest.mark.parametrize("bind", ["0.0.0.0", "::", "127.0.0.1"])
    def test_engines_may_listen_on_every_address_or_one_of_this_machines(self, bind: str) -> None:
        cfg = config.parse(AgentConfig, f"engine_bind: '{bind}'\nadvertise_address: 127.0.0.1\n")
        assert (cfg.engine_bind, cfg.advertise_address) == (bind, "127.0.0.1")

    @pytest.mark.parametrize("ports", ["20000-19999", "twenty", "20000-70000", "0-10"])
    def test_an_engine_port_range_that_is_not_one_is_refused_with_its_line(self, ports: str) -> None:
        with pytest.raises(ConfigError) as err:
            config.parse(AgentConfig, f"node_id: n1\nengine_ports: '{ports}'\n", "agent.yaml")
        assert str(err.value).startswith(
            f"agent.yaml:2: 'engine_ports' is '{ports}'; expected a range of ports"
        )

    def test_by_default_engines_take_ports_a_firewall_can_name(self) -> None:
        assert AgentConfig().engine_ports == "20000-20999"
        assert config.parse(AgentConfig, "engine_ports: '30000'\n").engine_ports == "30000"
