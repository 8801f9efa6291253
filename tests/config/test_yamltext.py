"""YAML a person wrote: aliases, nesting, tags and size within a budget; wrong kinds refused at their line."""

from __future__ import annotations

import ast
import tracemalloc
from pathlib import Path

import pytest

from llmgw import config
from llmgw.catalog import parse_model
from llmgw.config import ModelConfig, ServerConfig
from llmgw.config.yamltext import MAX_ALIASES, MAX_BYTES, MAX_DEPTH, MAX_VALUES
from llmgw.errors import ConfigError

ROOT = Path(__file__).parent.parent.parent


def billion_laughs() -> str:
    """Nine levels of nine aliases each: 342 bytes that stand for 387 million strings."""
    text = 'a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]\n'
    for previous, name in zip("abcdefgh", "bcdefghi", strict=True):
        text += f"{name}: &{name} [{','.join([f'*{previous}'] * 9)}]\n"
    return text


def _refusal(text: str, source: str = "m.yaml", cls: type = ModelConfig) -> str:
    with pytest.raises(ConfigError) as err:
        config.parse(cls, text, source)
    return str(err.value)


class TestExpansion:
    def test_nested_aliases_of_a_billion_values_are_refused_at_their_line_having_built_nothing(self) -> None:
        tracemalloc.start()
        try:
            with pytest.raises(ConfigError) as err:
                parse_model(billion_laughs(), "laughs.yaml")
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert str(err.value) == (
            f"laughs.yaml:5: uses more than {MAX_ALIASES} aliases (*name); write the values out"
        )
        # The text is 342 bytes; building even one level of it would take megabytes.
        assert peak < 1024 * 1024

    def test_few_aliases_that_expand_too_far_are_refused_too(self) -> None:
        many = ", ".join(["x"] * 5000)
        text = f"base: &b [{many}]\n" + "".join(f"k{i}: *b\n" for i in range(MAX_VALUES // 5000 + 1))
        assert _refusal(text, cls=ServerConfig).endswith(
            f"expands to more than {MAX_VALUES:,} values through its aliases (*name); write the values out"
        )

    def test_a_profile_shared_through_an_alias_and_a_merge_key_is_read(self) -> None:
        text = (
            "models:\n"
            "  - name: a\n"
            "    profiles: &gpu [{engine: sim, gpu_class: h100-80g}]\n"
            "  - name: b\n"
            "    profiles: *gpu\n"
            "  - name: c\n"
            "    profiles:\n"
            "      - <<: {engine: sim, nodes: 2}\n"
            "        name: wide\n"
        )
        cfg = config.parse(ServerConfig, text, "server.yaml")
        assert cfg.models[1].profiles == cfg.models[0].profiles
        assert (cfg.models[2].profiles[0].nodes, cfg.models[2].profiles[0].name) == (2, "wide")

    def test_nesting_deeper_than_the_budget_is_refused_not_a_recursion_error(self) -> None:
        text = "name: " + "[" * 5000 + "]" * 5000 + "\n"
        assert _refusal(text) == f"m.yaml:1: nests deeper than {MAX_DEPTH} levels"

    def test_text_over_the_size_limit_is_refused_with_its_size(self) -> None:
        text = "# " + "x" * MAX_BYTES + "\nname: m\n"
        assert _refusal(text) == (
            f"m.yaml: is {len(text):,} bytes; llmgw reads at most {MAX_BYTES:,} bytes of YAML"
        )


class TestWhatIsNotPlain:
    @pytest.mark.parametrize(
        ("value", "tag"),
        [
            ("!!python/object/apply:os.system [ls]", "tag:yaml.org,2002:python/object/apply:os.system"),
            ("!vault x", "!vault"),
            ("!!str 12", "tag:yaml.org,2002:str"),
        ],
    )
    def test_a_tag_is_refused_at_its_line(self, value: str, tag: str) -> None:
        assert _refusal(f"replicas: 1\nname: {value}\n") == (
            f"m.yaml:2: has the tag {tag}; write the plain value (in quotes for text)"
        )

    @pytest.mark.parametrize("number", ["9" * 5000, "0x" + "f" * 5000, "-" + "1" * 101])
    def test_a_number_too_long_to_mean_anything_is_refused_at_its_line_not_a_traceback(
        self, number: str
    ) -> None:
        assert _refusal(f"name: m\nreplicas: {number}\n") == (
            f"m.yaml:2: has a number of {len(number):,} characters; quote it if it is text"
        )

    def test_a_long_run_of_digits_in_quotes_is_text(self) -> None:
        assert config.parse(ModelConfig, f'name: "{"9" * 5000}"\n').name == "9" * 5000

    @pytest.mark.parametrize("text", ['name: "\\ud800"\n', '{"name": "m", "version": "\\udfff"}'])
    def test_half_a_character_is_refused_before_the_store_or_a_reply_cannot_write_it(self, text: str) -> None:
        assert _refusal(text).endswith("has an escape (\\uD800-\\uDFFF) that is half a character")

    def test_a_character_yaml_forbids_is_a_sentence_not_a_traceback(self) -> None:
        assert _refusal("name: a\x00b\n").startswith("m.yaml: not valid YAML: unacceptable character #x0000")

    @pytest.mark.parametrize(
        ("text", "error"),
        [
            ("? [a, b]\n: x\n", "m.yaml: a key is ('a', 'b')"),
            (
                "name: m\nprofiles:\n  - env: {? [a]: b}\n",
                "m.yaml:3: a key under 'profiles[0].env' is ('a',)",
            ),
            (
                "name: m\nprofiles:\n  - labels:\n      null: b\n",
                "m.yaml:3: a key under 'profiles[0].labels' is None",
            ),
            (
                "name: m\nprofiles:\n  - labels:\n      true: b\n",
                "m.yaml:3: a key under 'profiles[0].labels' is True",
            ),
        ],
    )
    def test_a_key_that_is_not_a_name_is_refused_never_turned_into_text(self, text: str, error: str) -> None:
        assert _refusal(text) == f"{error}; keys are names (text)"

    @pytest.mark.parametrize(
        ("text", "error"),
        [
            ("name: [a, b]\n", "m.yaml:1: 'name' is ['a', 'b']; expected a string"),
            ("name: m\nversion: {major: 1}\n", "m.yaml:2: 'version' is {'major': 1}; expected a string"),
            ("name: m\nsource: [https://x/]\n", "m.yaml:2: 'source' is ['https://x/']; expected a string"),
            (
                "name: m\nprofiles:\n  - engine: [sim]\n",
                "m.yaml:3: 'profiles[0].engine' is ['sim']; expected a string",
            ),
            (
                "name: m\nprofiles:\n  - labels: {zone: [eu, us]}\n",
                "m.yaml:3: 'profiles[0].labels.zone' is ['eu', 'us']; expected a string",
            ),
            (
                "name: m\nsha256: {w.gguf: {x: 1}}\n",
                "m.yaml:2: 'sha256.w.gguf' is {'x': 1}; expected a string",
            ),
            ("name: m\nfallbacks: [[a]]\n", "m.yaml:2: 'fallbacks[0]' is ['a']; expected a string"),
        ],
    )
    def test_a_list_or_mapping_where_text_is_expected_is_refused_with_file_line_and_key(
        self, text: str, error: str
    ) -> None:
        assert _refusal(text) == error

    def test_a_long_value_is_shortened_in_its_error(self) -> None:
        error = _refusal("name: [" + ", ".join(["word"] * 1000) + "]\n")
        assert error.endswith(" ...; expected a string") and len(error) < 160


def _yaml_loads(path: Path) -> bool:
    """Whether path calls `.load(` on a ruamel YAML object it makes (a dump-only YAML() reads nothing)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    makers = {"YAML"}
    names = {
        target.id
        for node in ast.walk(tree)
        if isinstance(node, ast.Assign)
        and isinstance(node.value, ast.Call)
        and getattr(node.value.func, "id", getattr(node.value.func, "attr", None)) in makers
        for target in node.targets
        if isinstance(target, ast.Name)
    }
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "load":
            owner = node.func.value
            if isinstance(owner, ast.Name) and owner.id in names:
                return True
            if isinstance(owner, ast.Call) and getattr(owner.func, "id", None) in makers:
                return True
    return False


def test_every_yaml_llmgw_reads_goes_through_read_yaml() -> None:
    """One reader: a second one, without the budgets, is how the billion laughs came back."""
    readers = [
        p.relative_to(ROOT).as_posix() for p in (ROOT / "src" / "llmgw").rglob("*.py") if _yaml_loads(p)
    ]
    assert readers == ["src/llmgw/config/yamltext.py"]
