"""server.yaml and agent.yaml: read, refused with file/line/key, and documented."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from ruamel.yaml import YAML

from llmgw import config
from llmgw.config import AgentConfig, MirrorConfig, ModelConfig, PriceConfig, ServerConfig
from llmgw.config.reference import render
from llmgw.errors import ConfigError

ROOT = Path(__file__).parent.parent
REFERENCE = ROOT / "docs" / "reference.md"


def _refusal(cls: type, text: str, source: str = "server.yaml") -> str:
    with pytest.raises(ConfigError) as err:
        config.parse(cls, text, source)
    return str(err.value)


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


class TestRefusals:
    """What cattrs finds wrong, said with the file, the line and the key."""

    def test_a_file_that_is_not_a_mapping_is_refused_as_a_whole(self) -> None:
        assert _refusal(ServerConfig, "- listen\n- auth\n") == "server.yaml: the file must be a mapping"

    @pytest.mark.parametrize(
        ("text", "error"),
        [
            ("tls: 5\n", "server.yaml:1: tls must be a mapping"),
            ("models: [5]\n", "server.yaml:1: models[0] must be a mapping"),
            ("pricing:\n  m: 5\n", "server.yaml:2: pricing.m must be a mapping"),
        ],
    )
    def test_a_section_that_is_not_a_mapping_is_named_with_its_line(self, text: str, error: str) -> None:
        assert _refusal(ServerConfig, text) == error

    def test_an_empty_key_says_what_it_expected(self) -> None:
        assert _refusal(ServerConfig, "listen: 127.0.0.1:1\nmodels:\n") == (
            "server.yaml:2: 'models' is empty; expected a list of a mapping"
        )

    def test_a_choice_not_offered_lists_the_choices(self) -> None:
        assert _refusal(ServerConfig, "control:\n  placement: pack\n") == (
            "server.yaml:2: 'control.placement' is 'pack'; expected one of spread, binpack"
        )

    def test_an_unknown_key_under_a_named_entry_is_placed_and_matched(self) -> None:
        assert _refusal(ServerConfig, "pricing:\n  m:\n    promt_per_1k: 1\n") == (
            "server.yaml:3: unknown key 'pricing.m.promt_per_1k'; did you mean 'prompt_per_1k'?"
        )

    def test_an_unknown_key_like_no_known_one_lists_the_known_keys(self) -> None:
        assert _refusal(MirrorConfig, "xyzzy: 1\n", "mirror.yaml") == (
            "mirror.yaml:1: unknown key 'xyzzy'; known keys: listen, root, hf_endpoint, hf_token_file, "
            "admin_listen, admin_tls, control_plane"
        )

    @pytest.mark.parametrize(
        ("text", "error"),
        [
            ("auth:\n  default_rpm: 1.5\n", "'auth.default_rpm' is 1.5; expected a whole number"),
            ("auth:\n  default_rpm: true\n", "'auth.default_rpm' is True; expected a whole number"),
            ("auth:\n  enabled: 'no'\n", "'auth.enabled' is 'no'; expected true or false"),
        ],
    )
    def test_a_number_or_yes_no_is_not_guessed_from_another_kind(self, text: str, error: str) -> None:
        assert _refusal(ServerConfig, text) == f"server.yaml:2: {error}"

    @pytest.mark.parametrize(
        ("text", "line"),
        [
            ("models:\n  - name: m\n    zzz: 1\n    replicas: x\n", "3: unknown key 'models[0].zzz'"),
            ("models:\n  - name: m\n    replicas: x\n    zzz: 1\n", "3: 'models[0].replicas' is 'x'"),
        ],
    )
    def test_of_several_faults_the_first_in_the_file_is_reported(self, text: str, line: str) -> None:
        assert _refusal(ServerConfig, text).startswith(f"server.yaml:{line}")

    def test_a_number_in_a_list_or_mapping_of_strings_is_read_as_its_text(self) -> None:
        model = config.parse(
            ModelConfig, "name: m\nprofiles:\n  - args: [--ctx, 4096]\n    env: {CUDA_VISIBLE_DEVICES: 0}\n"
        )
        assert model.profiles[0].args == ["--ctx", "4096"]
        assert model.profiles[0].env == {"CUDA_VISIBLE_DEVICES": "0"}

    def test_a_mapping_in_a_list_of_strings_is_refused_at_its_item(self) -> None:
        assert _refusal(ModelConfig, "name: m\nprofiles:\n  - args:\n      - {a: 1}\n", "m.yaml") == (
            "m.yaml:4: 'profiles[0].args[0]' is {'a': 1}; expected a string"
        )

    def test_an_optional_section_said_to_be_null_is_absent(self) -> None:
        assert config.parse(ModelConfig, "name: m\npricing: null\n").pricing is None
        assert config.parse(ModelConfig, "name: m\npricing: {prompt_per_1k: 2}\n").pricing == PriceConfig(2.0)


class TestLocation:
    ROOT_YAML = "listen: x\nmodels:\n  - name: m\n    profiles:\n      - engine: sim\n"

    def test_a_key_is_found_at_its_line_through_lists_and_mappings(self) -> None:
        root = YAML(typ="rt").load(self.ROOT_YAML)
        assert config.line_of(root, ["models", 0, "profiles", 0, "engine"]) == 5
        assert config.where("server.yaml", root, ["models", 0]) == "server.yaml:3"

    def test_a_key_the_file_lacks_is_placed_at_its_deepest_parent_the_file_has(self) -> None:
        root = YAML(typ="rt").load(self.ROOT_YAML)
        assert config.line_of(root, ["models", 0, "replicas"]) == 3
        assert config.where("server.yaml", root, ["auth", "enabled"]) == "server.yaml"

    def test_the_dotted_key_is_written_as_an_operator_searches_for_it(self) -> None:
        assert config.dotted(["models", 0, "profiles", 1, "engine"]) == "models[0].profiles[1].engine"

    def test_only_the_location_module_reads_yaml_line_numbers(self) -> None:
        """One lookup: a second copy is where `file:line` in two kinds of error drifts apart."""
        readers = [p for p in (ROOT / "src" / "llmgw").rglob("*.py") if ".lc." in p.read_text()]
        assert [p.relative_to(ROOT).as_posix() for p in readers] == ["src/llmgw/config/location.py"]


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

    def test_the_committed_reference_is_what_the_declarations_generate(self) -> None:
        """docs/reference.md is written by `make docs`; edit a field's help, then run it."""
        assert REFERENCE.read_text(encoding="utf-8") == render(), (
            "docs/reference.md is stale: run `make docs`"
        )


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
