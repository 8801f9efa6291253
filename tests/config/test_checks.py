"""Every address, port, duration and count in the configuration files is checked when a file is read."""

from __future__ import annotations

import re
import subprocess
import sys
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import pytest
from ruamel.yaml import YAML

from llmgw import config
from llmgw.cli.exit import EXIT_CONFIG
from llmgw.config import AgentConfig, MirrorConfig, ServerConfig
from llmgw.config.checks import Check
from llmgw.config.loading import unwrap_optional
from llmgw.errors import ConfigError

FILES = {"server.yaml": ServerConfig, "agent.yaml": AgentConfig, "mirror.yaml": MirrorConfig}

_LISTEN = [
    ("localhost", "expected host:port, such as"),
    ("127.0.0.1:99999", "port 99999 is outside 0-65535"),
    ("127.0.0.1:-1", "expected host:port, such as"),
    ("::1:8080", "an IPv6 address goes in brackets, as [::1]:8080"),
    ("[::zz]:8080", "::zz is not an IPv6 address"),
    ("300.0.0.1:8080", "300.0.0.1 is not an IPv4 address"),
    ("my_host:8080", "'my_host' is neither an IP address nor a host name"),
]
_POSITIVE_SECONDS = [
    (0, "expected more than 0 and at most 31,536,000 (seconds)"),
    (-1.5, "expected more than 0"),
    (float("nan"), "expected a finite number"),
    (float("inf"), "expected a finite number"),
    (1e12, "at most 31,536,000"),
]
_SECONDS = [
    (-5, "expected 0 or more and at most 31,536,000 (seconds)"),
    (float("nan"), "expected a finite number"),
    (float("-inf"), "expected a finite number"),
    (31_536_001, "at most 31,536,000"),
]
_COUNT = [(-1, "expected 0 or more")]
_AT_LEAST_ONE = [(0, "expected 1 or more"), (-3, "expected 1 or more")]
_URL = "expected an http:// or https:// URL"
# A price of 1e308 made one long prompt cost inf, which no JSON reply can hold.
_PRICE = [
    (-0.01, "expected 0 or more"),
    (float("nan"), "expected a finite number"),
    (1e308, "expected 0 or more and at most 1,000,000"),
    (1_000_000.5, "at most 1,000,000"),
]
# Rates reach the store's 64-bit integers (1e20 was an OverflowError there).
_RATE = [(-1, "expected 0 or more"), (10**20, "expected 0 or more and at most 1,000,000,000,000")]

# Every key that has a check, with values it refuses and what the refusal says. A key given a check
# and not listed here fails test_every_checked_key_is_tried, so none goes untested.
REFUSED: dict[tuple[str, str], list[tuple[Any, str]]] = {
    ("server.yaml", "listen"): _LISTEN,
    ("server.yaml", "admin_listen"): _LISTEN,
    ("server.yaml", "agent_listen"): _LISTEN,
    ("server.yaml", "drain_timeout_s"): _SECONDS,
    ("server.yaml", "auth.default_rpm"): _RATE,
    ("server.yaml", "auth.default_tpm"): _RATE,
    ("server.yaml", "auth.session_ttl_s"): _POSITIVE_SECONDS,
    ("server.yaml", "auth.oidc.issuer"): [("ftp://idp.example.com", "expected an http:// or https:// URL")],
    ("server.yaml", "auth.oidc.base_url"): [("llm.example.com", "expected an http:// or https:// URL")],
    ("server.yaml", "auth.oidc.clock_skew_s"): [(-1, "0 or more"), (601, "at most 600")],
    ("server.yaml", "auth.oidc.timeout_s"): [(0, "more than 0"), (121, "at most 120")],
    ("server.yaml", "auth.oidc.groups"): [
        ("teams:ml", "expected `admin`, `project:PROJECT`, `team:TEAM` or `org:ORG`"),
        ("Admin", "expected `admin`"),
        ("project:", "expected `admin`"),
    ],
    ("server.yaml", "auth.saml.base_url"): [("llm.example.com", "expected an http:// or https:// URL")],
    ("server.yaml", "auth.saml.groups"): [
        ("org", "expected `admin`, `project:PROJECT`, `team:TEAM` or `org:ORG`")
    ],
    ("server.yaml", "control.interval_s"): _POSITIVE_SECONDS,
    ("server.yaml", "control.grace_s"): _POSITIVE_SECONDS,
    ("server.yaml", "control.engine_check_s"): _POSITIVE_SECONDS,
    ("server.yaml", "control.endpoint_check_s"): _POSITIVE_SECONDS,
    ("server.yaml", "control.base_backoff_s"): _POSITIVE_SECONDS,
    ("server.yaml", "control.drain_timeout_s"): _SECONDS,
    ("server.yaml", "control.advertise"): [
        ("cp1", "expected host:port, such as 198.18.0.1:7443"),
        ("198.18.0.1:0", "port 0 is outside 1-65535"),
        (":7443", "it names no host"),
    ],
    ("server.yaml", "models[].replicas"): [*_COUNT, (10_001, "at most 10,000")],
    ("server.yaml", "models[].profiles[].gpus_per_node"): [*_COUNT, (1025, "at most 1,024")],
    ("server.yaml", "models[].profiles[].nodes"): [*_AT_LEAST_ONE, (10**20, "at most 10,000")],
    ("server.yaml", "models[].profiles[].min_memory_mb"): [*_COUNT, (10**9 + 1, "at most 1,000,000,000")],
    ("server.yaml", "models[].pricing.prompt_per_1k"): _PRICE,
    ("server.yaml", "models[].pricing.completion_per_1k"): _PRICE,
    ("server.yaml", "models[].max_tokens"): [*_AT_LEAST_ONE, (10**8 + 1, "at most 100,000,000")],
    ("server.yaml", "models[].fallback_when_busy"): [*_COUNT, (10**20, "at most 1,000,000")],
    ("server.yaml", "models[].endpoints[].url"): [("10.1.2.3:8000/v1", _URL), ("ftp://10.1.2.3/", _URL)],
    ("server.yaml", "models[].timeouts.connect_s"): _POSITIVE_SECONDS,
    ("server.yaml", "models[].timeouts.first_byte_s"): _POSITIVE_SECONDS,
    ("server.yaml", "models[].timeouts.idle_s"): _POSITIVE_SECONDS,
    ("server.yaml", "models[].timeouts.total_s"): _POSITIVE_SECONDS,
    ("server.yaml", "models[].timeouts.cold_start_s"): _SECONDS,
    ("server.yaml", "models[].scale.min"): [*_COUNT, (10_001, "at most 10,000")],
    ("server.yaml", "models[].scale.max"): [*_AT_LEAST_ONE, (10_001, "at most 10,000")],
    ("server.yaml", "models[].scale.idle_s"): _POSITIVE_SECONDS,
    ("server.yaml", "models[].scale.window_s"): _POSITIVE_SECONDS,
    ("server.yaml", "models[].scale.target_in_flight"): [
        (0, "expected more than 0"),
        (10**7, "at most 1,000,000"),
    ],
    ("server.yaml", "models[].scale.priority"): [*_COUNT, (1_001, "at most 1,000")],
    ("server.yaml", "pricing.<name>.prompt_per_1k"): _PRICE,
    ("server.yaml", "pricing.<name>.completion_per_1k"): _PRICE,
    ("server.yaml", "default_price.prompt_per_1k"): _PRICE,
    ("server.yaml", "default_price.completion_per_1k"): _PRICE,
    ("server.yaml", "usage_sync_s"): _POSITIVE_SECONDS,
    ("agent.yaml", "servers"): [
        ("127.0.0.1:0", "port 0 is outside 1-65535"),
        (":7443", "it names no host"),
        ("control-plane", "expected host:port, such as 127.0.0.1:7443"),
        ("fe80::1:7443", "an IPv6 address goes in brackets"),
    ],
    ("agent.yaml", "heartbeat_interval_s"): [
        (0, "expected more than 0 and at most 3,600 (seconds)"),
        (3601, "at most 3,600"),
        (float("nan"), "expected a finite number"),
    ],
    ("agent.yaml", "ready_timeout_s"): _SECONDS,
    ("agent.yaml", "engines"): [
        (
            "vlm",
            "known engines: llamacpp, sglang, sim, vllm; did you mean 'vllm'?",
        ),
        ("tgi", "known engines: llamacpp, sglang, sim, vllm"),
    ],
    ("agent.yaml", "engines.<name>.parallel"): [*_AT_LEAST_ONE, (100_001, "at most 100,000")],
    ("agent.yaml", "engines.<name>.index_url"): [
        ("pypi.internal/simple", _URL),
        ("file:///srv/simple", _URL),
    ],
    ("agent.yaml", "engines.<name>.wheelhouse"): [
        ("wheels", "expected an absolute directory (/srv/wheels) or an http:// or https:// URL"),
        ("ftp://mirror/wheels/", "expected an absolute directory"),
    ],
    ("agent.yaml", "probe.interval_s"): [(0, "expected more than 0 and at most 3,600 (seconds)")],
    ("agent.yaml", "probe.timeout_s"): [(3601, "at most 3,600"), (float("nan"), "expected a finite number")],
    ("agent.yaml", "probe.failures"): [*_AT_LEAST_ONE, (1001, "at most 1,000")],
    ("agent.yaml", "probe.progress_s"): _SECONDS,
    ("agent.yaml", "advertise_address"): [("192.0.2.250", "it is not an address of this machine")],
    ("agent.yaml", "engine_bind"): [("localhost", "expected an IP address of this machine")],
    ("agent.yaml", "engine_ports"): [("0-100", "expected a range of ports"), ("9-8", "first no more")],
    ("agent.yaml", "fabric_address"): [("not-an-ip", "expected an IP address of this machine")],
    ("mirror.yaml", "listen"): _LISTEN,
    ("server.yaml", "metrics_listen"): _LISTEN[1:],
    ("server.yaml", "weights_listen"): _LISTEN[1:],
    ("server.yaml", "monitoring.window_s"): [
        (9, "expected 10 or more"),
        (float("nan"), "expected a finite number"),
    ],
    ("agent.yaml", "metrics_listen"): _LISTEN[1:],
    ("server.yaml", "router.session_load_factor"): [(0.5, "expected 1 or more"), (float("nan"), "finite")],
    ("server.yaml", "router.prefix_index_entries"): [(0, "expected 1 or more"), (10**9, "at most")],
    ("server.yaml", "mirror.api"): [("models.internal:8082", _URL)],
    ("server.yaml", "database"): [
        ("postgresql://llmgw@/llmgw", "it names no host"),
        ("postgresql://db.internal/llmgw", "it names no user"),
        ("postgresql://llmgw@db.internal", "it names no database"),
        ("postgresql://llmgw@db.internal:70000/llmgw", "not a number from 1 to 65535"),
        ("postgresql://llmgw@db.internal:0/llmgw", "outside 1-65535"),
        ("postgres://llmgw@db.internal/llmgw?sslmode=disable", "llmgw reads none"),
    ],
    ("server.yaml", "mirror.url"): [("ftp://models.internal/", _URL)],
    ("mirror.yaml", "hf_endpoint"): [("", _URL), ("huggingface.co", _URL)],
    ("mirror.yaml", "admin_listen"): _LISTEN[1:],
    ("server.yaml", "admin_tokens"): [
        ("llmgw-admin-3q2xyz", "expected a token's sha256 (64 hexadecimal digits)"),
        ("ab" * 31, "never the token itself"),
    ],
    ("server.yaml", "engine_mirror.base_url"): [("mirror.example/engines", _URL), ("ftp://mirror/", _URL)],
    ("server.yaml", "engine_mirror.checksums"): [
        ("deadbeef", "expected `sha256:` and 64 hexadecimal digits"),
        ("md5:" + "0" * 32, "expected `sha256:` and 64 hexadecimal digits"),
    ],
    ("agent.yaml", "provision.api_url"): [("", _URL), ("api.github.com", _URL)],
    ("agent.yaml", "provision.download_url"): [("file:///srv/engines", _URL)],
}

# Values at the edge of what each kind of key allows, which must be read as they are.
ACCEPTED: dict[tuple[str, str], list[Any]] = {
    ("server.yaml", "listen"): ["127.0.0.1:0", "0.0.0.0:65535", ":8080", "[::1]:8080", "localhost:8080"],
    ("server.yaml", "drain_timeout_s"): [0, 31_536_000],
    ("server.yaml", "metrics_listen"): ["", "0.0.0.0:9100"],
    ("server.yaml", "weights_listen"): ["", "127.0.0.1:0"],
    ("server.yaml", "database"): [
        "",
        "/var/lib/llmgw/llmgw.db",
        "postgresql://llmgw:s3cret@db.internal:5433/llmgw",
        "postgres://llmgw@[::1]/llmgw",
    ],
    ("agent.yaml", "metrics_listen"): ["", "[::1]:0"],
    ("server.yaml", "control.grace_s"): [0.001],
    ("server.yaml", "auth.oidc.groups"): ["admin", "project:research", "team:7", "org:acme"],
    ("server.yaml", "models[].replicas"): [0, 10_000],
    ("server.yaml", "models[].timeouts.cold_start_s"): [0, 3600],
    ("server.yaml", "models[].scale.min"): [0, 10_000],
    ("server.yaml", "models[].scale.max"): [1, 10_000],
    ("server.yaml", "models[].scale.target_in_flight"): [0.5, 1_000_000],
    ("server.yaml", "models[].scale.priority"): [0, 1_000],
    ("server.yaml", "models[].profiles[].nodes"): [1],
    ("server.yaml", "models[].max_tokens"): [100_000_000],
    ("server.yaml", "auth.default_rpm"): [0, 1_000_000_000_000],
    ("server.yaml", "pricing.<name>.prompt_per_1k"): [0, 1_000_000],
    ("server.yaml", "default_price.completion_per_1k"): [1_000_000.0],
    ("agent.yaml", "servers"): ["cp.example:7443", "[fd00::1]:1"],
    ("agent.yaml", "heartbeat_interval_s"): [3600],
    ("agent.yaml", "probe.progress_s"): [0],
    ("server.yaml", "admin_tokens"): [" " + "5E" * 32],
    ("server.yaml", "engine_mirror.base_url"): ["", "http://10.0.0.5:8081/engines/"],
    ("server.yaml", "engine_mirror.checksums"): ["sha256:" + "ab" * 32],
    ("agent.yaml", "engines.<name>.index_url"): ["", "https://pypi.internal/simple"],
    ("agent.yaml", "engines.<name>.wheelhouse"): ["", "/srv/wheels", "http://mirror.internal/wheels/"],
}


def checked_keys(cls: type, prefix: str = "") -> Iterator[str]:
    """Every dotted key of cls whose field declares a check, as docs/reference.md names it."""
    hints = typing.get_type_hints(cls)
    for f in attrs.fields(cls):
        key = f"{prefix}{f.name}"
        if isinstance(f.metadata.get("check"), Check):
            yield key
        inner = unwrap_optional(hints[f.name])
        args = typing.get_args(inner)
        if attrs.has(inner):
            yield from checked_keys(inner, f"{key}.")
        elif typing.get_origin(inner) is list and attrs.has(args[0]):
            yield from checked_keys(args[0], f"{key}[].")
        elif typing.get_origin(inner) is dict and attrs.has(args[1]):
            yield from checked_keys(args[1], f"{key}.<name>.")


def numeric_or_address_keys(cls: type, prefix: str = "") -> Iterator[str]:
    """Keys that hold a number, an address or a port: the kinds this file holds every one of to a check."""
    hints = typing.get_type_hints(cls)
    for f in attrs.fields(cls):
        key = f"{prefix}{f.name}"
        inner = unwrap_optional(hints[f.name])
        args = typing.get_args(inner)
        if inner in (int, float) or re.search(r"(listen|address|servers|ports|bind|url)$", f.name):
            yield key
        if attrs.has(inner):
            yield from numeric_or_address_keys(inner, f"{key}.")
        elif typing.get_origin(inner) is list and attrs.has(args[0]):
            yield from numeric_or_address_keys(args[0], f"{key}[].")
        elif typing.get_origin(inner) is dict and attrs.has(args[1]):
            yield from numeric_or_address_keys(args[1], f"{key}.<name>.")


# Keys whose items (values) are checked one by one, each at its own line.
_LISTS = ("servers", "admin_tokens")
_MAPPINGS = ("engine_mirror.checksums", "auth.oidc.groups", "auth.saml.groups")
# Mappings whose keys are checked: the value tried is a key.
_NAMES = ("engines",)
# What stands for <name> in a key: a mapping of engines takes only the names of engines.
_NAME_OF = {"engines": "llamacpp"}


def file_saying(key: str, value: Any) -> tuple[str, str]:
    """(YAML text setting key to value, the key as its error names it)."""
    name = _NAME_OF.get(key.split(".")[0], "m")
    named = key.replace("[]", "[0]").replace("<name>", name)
    data: Any = value
    if key in _LISTS:
        data, named = [value], f"{named}[0]"
    elif key in _MAPPINGS:
        data, named = {"asset.tar.gz": value}, f"{named}.asset.tar.gz"
    elif key in _NAMES:
        data, named = {value: {}}, f"{named}.{value}"
    for part in reversed(key.split(".")):
        if part.endswith("[]"):
            entry: dict[str, Any] = {"name": "m"} if part == "models[]" else {}
            data = {part[:-2]: [{**entry, **data}]}
        elif part == "<name>":
            data = {name: data}
        else:
            data = {part: data}
    text = _yaml_text(data)
    return text, named


def _yaml_text(data: Any) -> str:
    import io

    out = io.StringIO()
    yaml = YAML(typ="safe")
    yaml.default_flow_style = False
    yaml.dump(data, out)
    return out.getvalue()


CASES = [(file, key, value, said) for (file, key), refused in REFUSED.items() for value, said in refused]


@pytest.mark.parametrize(
    ("file", "key", "value", "said"), CASES, ids=[f"{f}:{k}={v!r}" for f, k, v, _ in CASES]
)
def test_a_value_the_key_does_not_allow_is_refused_with_file_line_key_and_what_is_allowed(
    file: str, key: str, value: Any, said: str
) -> None:
    text, named = file_saying(key, value)
    with pytest.raises(ConfigError) as err:
        config.parse(FILES[file], text, file)
    assert re.fullmatch(
        rf"{re.escape(file)}:\d+: '{re.escape(named)}' is .+; .*{re.escape(said)}.*", str(err.value)
    )


ACCEPTED_CASES = [(file, key, value) for (file, key), values in ACCEPTED.items() for value in values]


@pytest.mark.parametrize(("file", "key", "value"), ACCEPTED_CASES)
def test_a_value_at_the_edge_of_what_a_key_allows_is_read(file: str, key: str, value: Any) -> None:
    text, _ = file_saying(key, value)
    config.parse(FILES[file], text, file)


@pytest.mark.parametrize("file", FILES)
def test_every_checked_key_is_tried(file: str) -> None:
    assert sorted(checked_keys(FILES[file])) == sorted(k for f, k in REFUSED if f == file)


@pytest.mark.parametrize("file", FILES)
def test_every_number_address_and_port_is_checked(file: str) -> None:
    """A new number or address key without a check fails here, not in a person's hands."""
    assert set(numeric_or_address_keys(FILES[file])) <= set(checked_keys(FILES[file]))


def test_what_a_key_allows_is_in_the_reference() -> None:
    reference = (Path(__file__).parent.parent.parent / "docs" / "reference.md").read_text()
    assert "| `drain_timeout_s` | number: 0 or more and at most 31,536,000 (seconds) |" in reference


def _llmgw(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "llmgw", *args], capture_output=True, text=True, cwd=cwd, timeout=60
    )


class TestListenersTogether:
    @pytest.mark.parametrize(
        ("text", "said"),
        [
            (
                "listen: 127.0.0.1:9090\n",
                "s.yaml:1: 'listen' (127.0.0.1:9090) and 'admin_listen' (127.0.0.1:9090) take the same port",
            ),
            (
                "state_dir: /tmp/x\nagent_listen: 0.0.0.0:9090\n",
                "s.yaml:2: 'admin_listen' (127.0.0.1:9090) and 'agent_listen' (0.0.0.0:9090) take the same",
            ),
            (
                "admin_listen: 127.0.0.1:7443\nagent_listen: '[::]:7443'\n",
                "s.yaml:2: 'admin_listen' (127.0.0.1:7443) and 'agent_listen' ([::]:7443) take the same port",
            ),
        ],
    )
    def test_two_listeners_on_one_port_are_refused_at_the_line_that_sets_one(
        self, text: str, said: str
    ) -> None:
        with pytest.raises(ConfigError) as err:
            config.parse(ServerConfig, text, "s.yaml")
        assert str(err.value).startswith(said)

    @pytest.mark.parametrize(
        "text",
        ["listen: 127.0.0.2:9090\n", "listen: 127.0.0.1:0\nadmin_listen: 127.0.0.1:0\nagent_listen: :0\n"],
    )
    def test_listeners_on_other_addresses_or_free_ports_are_read(self, text: str) -> None:
        config.parse(ServerConfig, text, "s.yaml")


class TestBeforeAnythingListens:
    @pytest.mark.parametrize(
        ("line", "said"),
        [
            ("listen: 127.0.0.1:99999", ":1: 'listen' is '127.0.0.1:99999'; port 99999 is outside 0-65535"),
            ("listen: localhost", ":1: 'listen' is 'localhost'; expected host:port, such as 127.0.0.1:8080"),
            ("drain_timeout_s: -5", ":1: 'drain_timeout_s' is -5.0; expected 0 or more"),
        ],
    )
    def test_a_server_yaml_the_examples_got_wrong_exits_78_having_created_nothing(
        self, tmp_path: Path, line: str, said: str
    ) -> None:
        state = tmp_path / "state"
        server_yaml = tmp_path / "server.yaml"
        server_yaml.write_text(f"{line}\nstate_dir: {state}\nagent_listen: 127.0.0.1:0\n")
        result = _llmgw("--role=server", "--config", str(server_yaml), cwd=tmp_path)
        assert result.returncode == EXIT_CONFIG
        assert result.stderr.strip().splitlines()[-1].startswith(f"llmgw: {server_yaml}{said}")
        assert "Traceback" not in result.stderr
        # Nothing was started: the store the server opens first is not there.
        assert not state.exists()

    @pytest.mark.parametrize(
        ("flag", "value", "said"),
        [
            ("--listen", "127.0.0.1:99999", "--listen is '127.0.0.1:99999'; port 99999 is outside 0-65535"),
            ("--admin-listen", "localhost", "--admin-listen is 'localhost'; expected host:port"),
            ("--drain-timeout", "-5", "--drain-timeout is -5.0; expected 0 or more"),
            ("--drain-timeout", "nan", "--drain-timeout is nan; expected a finite number"),
            (
                "--listen",
                "127.0.0.1:9090",
                "with --listen or --admin-listen, 'listen' (127.0.0.1:9090) and "
                "'admin_listen' (127.0.0.1:9090) take the same port",
            ),
        ],
    )
    def test_a_flag_that_overrides_a_key_is_held_to_the_key_s_check(
        self, tmp_path: Path, flag: str, value: str, said: str
    ) -> None:
        state = tmp_path / "state"
        server_yaml = tmp_path / "server.yaml"
        server_yaml.write_text(f"state_dir: {state}\nagent_listen: 127.0.0.1:0\n")
        result = _llmgw("--role=server", "--config", str(server_yaml), flag, value, cwd=tmp_path)
        assert result.returncode == EXIT_CONFIG
        assert result.stderr.strip().splitlines()[-1].startswith(f"llmgw: {said}")
        assert "Traceback" not in result.stderr
        assert not state.exists()
