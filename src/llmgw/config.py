"""server.yaml and agent.yaml: attrs classes, loaded with ruamel.yaml, structured with cattrs.

Every field carries its help text in metadata; docs/reference.md documents
every key and a test holds that it does. A file that cannot be used is refused
at start with the file, the line, the key and what was expected, because an
operator who learns about a typo only when a request fails has lost an hour.
"""

from __future__ import annotations

import copy
import difflib
import io
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal, TypeVar

import attrs
import cattrs
from cattrs.errors import ClassValidationError, IterableValidationError
from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap, CommentedSeq
from ruamel.yaml.error import MarkedYAMLError

from llmgw import addresses
from llmgw.errors import ConfigError

T = TypeVar("T")


def _field(default: Any, help: str, check: Callable[[object], str] | None = None) -> Any:
    """An attrs field with its help text; mutable and nested defaults are copied per instance.

    check, when given, says why a value read from a file cannot be used (empty: it can).
    """
    metadata = {"help": help, "check": check} if check is not None else {"help": help}
    if isinstance(default, (list, dict)) or attrs.has(type(default)):
        return attrs.field(factory=lambda: copy.deepcopy(default), metadata=metadata)
    return attrs.field(default=default, metadata=metadata)


@attrs.frozen
class TLSConfig:
    ca: str = _field("", "Certificate authority (PEM) that signed the other side's certificate.")
    cert: str = _field("", "This side's certificate (PEM).")
    key: str = _field("", "This side's private key (PEM).")


@attrs.frozen
class AuthConfig:
    enabled: bool = _field(True, "Require `Authorization: Bearer <key>` on /v1/*.")
    default_rpm: int = _field(0, "Requests per minute for a key no scope limits; 0 means unlimited.")
    default_tpm: int = _field(0, "Tokens per minute for a key no scope limits; 0 means unlimited.")
    signup_open: bool = _field(False, "Whether /signup accepts new accounts (pending until approved).")
    session_ttl_s: float = _field(
        43200.0, "How long a sign-in to the pages lasts (the session cookie's lifetime), in seconds."
    )


@attrs.frozen
class ControlConfig:
    enabled: bool = _field(True, "Run the control plane: the agent service, placement and reconciliation.")
    interval_s: float = _field(2.0, "How often the reconciler compares desired and actual replicas.")
    grace_s: float = _field(
        15.0,
        "How long a node may stay silent before it is marked unreachable "
        "and its replicas leave the routing table.",
    )
    base_backoff_s: float = _field(
        5.0,
        "First wait before a model is tried again on a node where its replica failed; doubles with each "
        "further failure there, and other nodes are tried meanwhile.",
    )
    drain_timeout_s: float = _field(
        300.0,
        "How long the replicas of a draining node may finish their in-flight requests "
        "before they are stopped anyway.",
    )
    placement: Literal["spread", "binpack"] = _field(
        "spread",
        "How replicas are laid over candidate nodes: `spread` (fewest replicas first) "
        "or `binpack` (the fullest node that still fits first).",
    )


@attrs.frozen
class ProfileConfig:
    engine: str = _field("sim", "Engine that serves this profile: sim, llamacpp, vllm or sglang.")
    name: str = _field("default", "Name of the profile, shown in placement explanations.")
    args: list[str] = _field([], "Extra command-line arguments passed to the engine.")
    env: dict[str, str] = _field({}, "Extra environment variables for the engine process.")
    gpu_class: str = _field(
        "", "GPU class each node must give the replica, such as `h100-80g`; empty means any class."
    )
    gpus_per_node: int = _field(
        0, "GPUs each node gives one replica; 0 means none, or 1 when `gpu_class` is set."
    )
    nodes: int = _field(1, "Nodes one replica spans; more than 1 needs nodes on one fabric.")
    min_memory_mb: int = _field(0, "Memory (MB) each node must have free for one replica.")
    labels: dict[str, str] = _field({}, "Labels (agent.yaml `labels`) a node must carry, with these values.")


@attrs.frozen
class ModelConfig:
    name: str = _field("", "The model name clients ask for in `model`.")
    replicas: int = _field(1, "How many replicas to keep running.")
    profiles: list[ProfileConfig] = _field([], "Ways to run the model, tried in order.")
    version: str = _field("", "The model's version, shown with its name; free text.")
    source: str = _field(
        "",
        "URL of the weights: a file, or a directory when it ends in `/`; empty for engines that need none.",
    )
    sha256: dict[str, str] = _field({}, "Pinned sha256 digests of the weights, by file name.")
    fallbacks: list[str] = _field(
        [], "Models to serve a request with, in order, when this one has no ready replica."
    )
    # None, not zeros: a model priced at nothing is free, one without a price takes `pricing` or
    # `default_price`.
    pricing: PriceConfig | None = _field(
        None,
        "This model's price (`prompt_per_1k`, `completion_per_1k`); before server.yaml's `pricing` entry "
        "and `default_price`. How a model added with `llmgw ctl model add` carries its price.",
    )


@attrs.frozen
class PriceConfig:
    prompt_per_1k: float = _field(0.0, "Price of 1,000 prompt tokens, in the unit budgets are set in.")
    completion_per_1k: float = _field(
        0.0, "Price of 1,000 completion tokens, in the unit budgets are set in."
    )


@attrs.frozen
class EngineMirrorConfig:
    base_url: str = _field(
        "",
        "An offline mirror of the engines' release downloads, sent to every node in place of the publisher: "
        "`<base_url>/<repo>/releases/download/<tag>/<asset>`. Empty: nodes download from the publisher.",
    )
    checksums: dict[str, str] = _field(
        {},
        "Release asset name -> `sha256:<hex>`, sent to every node in place of the publisher's digests; "
        "an asset not listed is refused, never installed unchecked.",
    )


@attrs.frozen
class ServerConfig:
    listen: str = _field("127.0.0.1:8080", "Gateway address (host:port): /v1/*, /health and the pages.")
    admin_listen: str = _field("127.0.0.1:9090", "Admin listener (host:port), for this machine only.")
    admin_tokens: list[str] = _field(
        [],
        "sha256 digests (hex) of the tokens that may use the admin API from elsewhere: "
        "`llmgw ctl --server URL --token TOKEN` against /admin on `listen`. `llmgw ctl new-token` makes one.",
    )
    agent_listen: str = _field("127.0.0.1:7443", "Agent service address (host:port), gRPC over mutual TLS.")
    state_dir: str = _field("/var/lib/llmgw", "Directory for the store and other state.")
    database: str = _field("", "SQLite file of the store; empty means `<state_dir>/llmgw.db`.")
    drain_timeout_s: float = _field(10.0, "How long a stopping server waits for in-flight requests.")
    tls: TLSConfig = _field(TLSConfig(), "Certificates of the agent service (mutual TLS).")
    auth: AuthConfig = _field(AuthConfig(), "Who may call the gateway.")
    control: ControlConfig = _field(ControlConfig(), "The control plane.")
    models: list[ModelConfig] = _field([], "The model catalog.")
    engines: dict[str, str] = _field(
        {},
        "Engines every node installs, by name, at a version (`llamacpp: b11434`); llama.cpp defaults to "
        "the build this release was checked against; an empty version removes an engine.",
    )
    engine_mirror: EngineMirrorConfig = _field(
        EngineMirrorConfig(), "Where nodes install engines from on a site that cannot reach the publisher."
    )
    pricing: dict[str, PriceConfig] = _field(
        {},
        "Prices per model: `MODEL: {prompt_per_1k: P, completion_per_1k: C}`; budgets are counted in them.",
    )
    default_price: PriceConfig = _field(
        PriceConfig(), "Price of a model `pricing` does not name; both 0 means such a model has no price."
    )

    @property
    def database_path(self) -> Path:
        return Path(self.database) if self.database else Path(self.state_dir) / "llmgw.db"


@attrs.frozen
class EngineOptions:
    binary: str = _field(
        "", "Path of an engine binary built by hand; the agent then never installs this engine."
    )
    parallel: int = _field(4, "Requests the engine serves at once (llama.cpp's `-np`).")


@attrs.frozen
class EnginesConfig:
    disabled: list[str] = _field([], "Engines this node never installs nor reports.")
    llamacpp: EngineOptions = _field(EngineOptions(), "llama.cpp options.")
    vllm: EngineOptions = _field(EngineOptions(), "vLLM options.")
    sglang: EngineOptions = _field(EngineOptions(), "SGLang options.")


@attrs.frozen
class ProvisionConfig:
    dir: str = _field("", "Directory engines are installed under; empty means `<state_dir>/engines`.")
    api_url: str = _field(
        "https://api.github.com",
        "Release API the checksums of engine builds are read from (GitHub's, or one shaped like it).",
    )
    download_url: str = _field(
        "https://github.com",
        "Where engine builds are downloaded from: `<download_url>/<repo>/releases/download/<tag>/<asset>`.",
    )


@attrs.frozen
class AgentConfig:
    node_id: str = _field("", "This node's id; must equal the common name of its certificate.")
    servers: list[str] = _field(["127.0.0.1:7443"], "Agent service addresses (host:port), tried in order.")
    state_dir: str = _field("/var/lib/llmgw-agent", "Directory for the agent's state and installed engines.")
    weights_cache: str = _field("", "Directory for model weights; empty means `<state_dir>/weights`.")
    heartbeat_interval_s: float = _field(2.0, "How often the agent sends a heartbeat.")
    ready_timeout_s: float = _field(120.0, "How long an engine may take to answer its health check.")
    tls: TLSConfig = _field(
        TLSConfig(), "This node's certificate and the authority that signed the server's."
    )
    labels: dict[str, str] = _field({}, "Labels placement profiles can require.")
    engines: EnginesConfig = _field(EnginesConfig(), "Engine installation and options.")
    provision: ProvisionConfig = _field(ProvisionConfig(), "Where the agent installs engines from, and to.")
    fabric: str = _field(
        "",
        "InfiniBand fabric this node is attached to; nodes given the same name can host one "
        "multi-node replica together. Empty: no fabric, single-node replicas only.",
    )
    hcas: list[str] = _field(
        [], "The fabric's HCAs (e.g. mlx5_0); empty means every HCA under /sys/class/infiniband."
    )
    model_dirs: list[str] = _field(
        [], "Other directories weights live in (an NFS export, local NVMe); their free space is reported."
    )
    keep_engines_on_stop: bool = _field(
        True,
        "Leave engines running when the agent stops, for the next agent to adopt; `--dev` always stops them.",
    )
    advertise_address: str = _field(
        "",
        "The address of this node the control plane's gateway reaches its engines at: the endpoint of "
        "every replica here. Empty: the local address of the agent's own connection to the control "
        "plane (on a single host, 127.0.0.1). Must be an IP address of this machine.",
        check=addresses.own_address_problem,
    )
    engine_bind: str = _field(
        "",
        "The address engines listen on. Empty: the advertised address; `0.0.0.0` or `::` for every "
        "address of the machine. Otherwise an IP address of this machine.",
        check=addresses.bind_address_problem,
    )
    engine_ports: str = _field(
        addresses.DEFAULT_ENGINE_PORTS,
        "The ports engines listen on, `FIRST-LAST`, so a firewall can name them: only the control plane's "
        "gateway hosts need to reach them. A replica that finds no free port there fails, saying so.",
        check=addresses.port_range_problem,
    )
    fabric_address: str = _field(
        "",
        "This node's address on its fabric's management network, where the other nodes of a multi-node "
        "replica reach its rank 0. Empty: the advertised address. Must be an IP address of this machine.",
        check=addresses.own_address_problem,
    )

    @property
    def engines_dir(self) -> Path:
        return Path(self.provision.dir) if self.provision.dir else Path(self.state_dir) / "engines"

    @property
    def weights_dir(self) -> Path:
        return Path(self.weights_cache) if self.weights_cache else Path(self.state_dir) / "weights"


_converter = cattrs.Converter(forbid_extra_keys=True)


def _location(node: Any, path: list[Any]) -> tuple[int | None, str]:
    """The line of the deepest node on path that ruamel.yaml knows, and the dotted key."""
    line: int | None = None
    cursor = node
    for part in path:
        if isinstance(cursor, CommentedMap) and part in cursor:
            line = cursor.lc.key(part)[0] + 1
            cursor = cursor[part]
        elif isinstance(cursor, CommentedSeq) and isinstance(part, int) and part < len(cursor):
            line = cursor.lc.item(part)[0] + 1
            cursor = cursor[part]
        else:
            break
    dotted = ".".join(f"[{p}]" if isinstance(p, int) else str(p) for p in path).replace(".[", "[")
    return line, dotted


def _type_name(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin is list:
        return f"a list of {_type_name(typing.get_args(tp)[0])}"
    if origin is dict:
        return "a mapping"
    if attrs.has(tp):
        return "a mapping"
    return {str: "a string", int: "a whole number", float: "a number", bool: "true or false"}.get(tp, str(tp))


def _unwrap_optional(tp: Any) -> Any:
    """X for `X | None` where X is a config class (absent is None), so its keys are checked and documented."""
    args = [a for a in typing.get_args(tp) if a is not type(None)]
    if type(None) in typing.get_args(tp) and len(args) == 1 and attrs.has(args[0]):
        return args[0]
    return tp


def _check_keys(cls: type, node: Any, path: list[Any], source: str, root: Any) -> None:
    """Refuse unknown keys with the nearest known one, and wrong shapes, with their line."""
    hints = typing.get_type_hints(cls)
    if not isinstance(node, dict):
        line, dotted = _location(root, path)
        where = f"{source}:{line}" if line else source
        raise ConfigError(f"{where}: {dotted or 'the file'} must be a mapping")
    for key, value in node.items():
        names = [f.name for f in attrs.fields(cls)]
        if key not in names:
            line, dotted = _location(root, [*path, key])
            near = difflib.get_close_matches(str(key), names, n=1)
            hint = f"; did you mean '{near[0]}'?" if near else f"; known keys: {', '.join(names)}"
            raise ConfigError(f"{source}:{line}: unknown key '{dotted}'{hint}")
        if value is None and type(None) in typing.get_args(hints[key]):
            continue  # absent, said out loud (`pricing: null`, as `dump` writes it)
        tp = _unwrap_optional(hints[key])
        if attrs.has(tp) and value is not None:
            _check_keys(tp, value, [*path, key], source, root)
        elif typing.get_origin(tp) is list and isinstance(value, list):
            (item,) = typing.get_args(tp)
            if attrs.has(item):
                for i, entry in enumerate(value):
                    _check_keys(item, entry, [*path, key, i], source, root)
        elif typing.get_origin(tp) is dict and isinstance(value, dict):
            item = typing.get_args(tp)[1]
            if attrs.has(item):
                for name, entry in value.items():
                    _check_keys(item, entry, [*path, key, name], source, root)
        if value is None:
            line, dotted = _location(root, [*path, key])
            raise ConfigError(f"{source}:{line}: '{dotted}' is empty; expected {_type_name(tp)}")
        if typing.get_origin(tp) is Literal and value not in typing.get_args(tp):
            line, dotted = _location(root, [*path, key])
            choices = ", ".join(str(c) for c in typing.get_args(tp))
            raise ConfigError(f"{source}:{line}: '{dotted}' is {value!r}; expected one of {choices}")
        if tp is bool and not isinstance(value, bool):
            line, dotted = _location(root, [*path, key])
            raise ConfigError(f"{source}:{line}: '{dotted}' is {value!r}; expected true or false")
        if tp in (int, float) and (isinstance(value, bool) or not isinstance(value, (int, float))):
            line, dotted = _location(root, [*path, key])
            raise ConfigError(f"{source}:{line}: '{dotted}' is {value!r}; expected {_type_name(tp)}")
        if tp is int and isinstance(value, float):
            line, dotted = _location(root, [*path, key])
            raise ConfigError(f"{source}:{line}: '{dotted}' is {value!r}; expected {_type_name(tp)}")
        if tp is str and not isinstance(value, str):
            line, dotted = _location(root, [*path, key])
            raise ConfigError(f"{source}:{line}: '{dotted}' is {value!r}; expected a string")
        if typing.get_origin(tp) in (list, dict) and not isinstance(value, typing.get_origin(tp)):
            line, dotted = _location(root, [*path, key])
            raise ConfigError(f"{source}:{line}: '{dotted}' is {value!r}; expected {_type_name(tp)}")
        check = attrs.fields_dict(cls)[key].metadata.get("check")
        if check is not None and (problem := check(value)):
            line, dotted = _location(root, [*path, key])
            raise ConfigError(f"{source}:{line}: '{dotted}' is {value!r}; {problem}")


def _first_error_path(exc: BaseException) -> list[Any]:
    """The key path of the first leaf error cattrs reports."""
    path: list[Any] = []
    while isinstance(exc, (ClassValidationError, IterableValidationError)) and exc.exceptions:
        inner = exc.exceptions[0]
        note = getattr(inner, "__notes__", [""])
        # cattrs notes read "Structuring class X @ attribute name" / "@ index 0".
        for text in note:
            if "@ attribute " in text:
                path.append(text.rsplit(" ", 1)[-1])
            elif "@ index " in text:
                path.append(int(text.rsplit(" ", 1)[-1]))
        exc = inner
    return path


def parse(cls: type[T], text: str, source: str = "<string>") -> T:
    """Structure YAML text into cls, or raise ConfigError naming source, line and key."""
    yaml = YAML(typ="rt")
    try:
        data = yaml.load(io.StringIO(text))
    except MarkedYAMLError as exc:
        mark = exc.problem_mark
        line = mark.line + 1 if mark is not None else "?"
        raise ConfigError(f"{source}:{line}: not valid YAML: {exc.problem}") from None
    if data is None:
        data = CommentedMap()
    _check_keys(cls, data, [], source, data)
    try:
        return _converter.structure(_plain(data), cls)
    except (ClassValidationError, IterableValidationError) as exc:
        path = _first_error_path(exc)
        line, dotted = _location(data, path)
        raise ConfigError(f"{source}:{line}: '{dotted}' could not be read: {exc.exceptions[0]}") from None


def _plain(node: Any) -> Any:
    if isinstance(node, dict):
        return {str(k): _plain(v) for k, v in node.items()}
    if isinstance(node, list):
        return [_plain(v) for v in node]
    return node


def load(cls: type[T], path: Path) -> T:
    """Read and structure a configuration file."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{path}: cannot be read: {exc.strerror}") from None
    return parse(cls, text, str(path))


def dump(value: Any) -> str:
    """YAML text for a configuration object, as `llmgw` itself would write it."""
    yaml = YAML(typ="safe")
    yaml.default_flow_style = False
    out = io.StringIO()
    yaml.dump(_converter.unstructure(value), out)
    return out.getvalue()


def documented_keys(cls: type, prefix: str = "") -> list[tuple[str, str]]:
    """Every dotted key of cls with its help text, for docs/reference.md and its test."""
    keys: list[tuple[str, str]] = []
    hints = typing.get_type_hints(cls)
    for f in attrs.fields(cls):
        dotted = f"{prefix}{f.name}"
        keys.append((dotted, f.metadata.get("help", "")))
        tp = _unwrap_optional(hints[f.name])
        if attrs.has(tp):
            keys.extend(documented_keys(tp, f"{dotted}."))
        elif typing.get_origin(tp) is list and attrs.has(typing.get_args(tp)[0]):
            keys.extend(documented_keys(typing.get_args(tp)[0], f"{dotted}[]."))
        elif typing.get_origin(tp) is dict and attrs.has(typing.get_args(tp)[1]):
            keys.extend(documented_keys(typing.get_args(tp)[1], f"{dotted}.<name>."))
    return keys


@attrs.frozen
class MirrorConfig:
    listen: str = _field("127.0.0.1:8081", "Address (host:port) the mirror serves model files on.")
    root: str = _field("/var/lib/llmgw-mirror", "Directory whose files the mirror serves.")


def evolve(value: T, **changes: Any) -> T:
    """A copy of a configuration object with some keys changed."""
    return attrs.evolve(value, **changes)  # type: ignore[misc]
