"""What server.yaml, agent.yaml and mirror.yaml may say: attrs classes whose fields carry defaults and help.

These declarations are the only place a key is described: loading.py structures
files into them and reference.py writes docs/reference.md from them.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import attrs

from llmgw import addresses
from llmgw.config.checks import (
    ASSET_DIGESTS,
    DATABASE,
    ENGINE_KINDS,
    OIDC_GRANTS,
    TOKEN_DIGESTS,
    WHEELHOUSE,
    Check,
    dial_address,
    http_url,
    listen_address,
    number,
    optional_dial_address,
    optional_listen_address,
    seconds,
)
from llmgw.config.database import is_postgres_url
from llmgw.maxima import (
    MAX_GPUS_PER_NODE,
    MAX_IN_FLIGHT,
    MAX_MEMORY_MB,
    MAX_NODES_PER_REPLICA,
    MAX_PARALLEL,
    MAX_PER_MINUTE,
    MAX_PRICE_PER_1K,
    MAX_PRIORITY,
    MAX_REPLICAS,
    MAX_TOKENS,
)


def _field(
    default: Any, help: str, check: Check | None = None, older: Callable[[Any], Any] | None = None
) -> Any:
    """An attrs field with its help text; mutable and nested defaults are copied per instance.

    check, when given, is what the key allows beyond its type: held when a file is read, and
    printed in docs/reference.md. older, when given, rewrites a value in a shape an earlier llmgw
    read into today's, before it is read, so that a file written for it still loads.
    """
    metadata: dict[str, Any] = {"help": help}
    if check is not None:
        metadata["check"] = check
    if older is not None:
        metadata["older"] = older
    if isinstance(default, (list, dict)) or attrs.has(type(default)):
        return attrs.field(factory=lambda: copy.deepcopy(default), metadata=metadata)
    return attrs.field(default=default, metadata=metadata)


_OWN_ADDRESS = Check("empty or an IP address of this machine", addresses.own_address_problem)


@attrs.frozen
class TLSConfig:
    ca: str = _field("", "Certificate authority (PEM) that signed the other side's certificate.")
    cert: str = _field("", "This side's certificate (PEM).")
    key: str = _field("", "This side's private key (PEM).")


@attrs.frozen
class OidcConfig:
    issuer: str = _field(
        "",
        "The identity provider's issuer URL (its `/.well-known/openid-configuration` is read from it). "
        "Empty: no sign-in through a provider. See docs/accounts.md, OpenID Connect.",
        http_url(empty_ok=True),
    )
    client_id: str = _field("", "The client id the provider gave llmgw.")
    client_secret_file: str = _field(
        "", "A file holding the client secret (read at start; never shown, logged or returned)."
    )
    client_secret_env: str = _field(
        "", "An environment variable holding the client secret, when client_secret_file is empty."
    )
    base_url: str = _field(
        "",
        "The address people reach the pages at, such as `https://llm.example.com`: the redirect URI "
        "to register at the provider is this followed by `/login/oidc/callback`.",
        http_url(empty_ok=True),
    )
    scopes: list[str] = _field(
        ["openid", "email", "profile"],
        "The scopes asked for; add the one that puts the groups claim in the ID token where the "
        "provider needs one (Okta: `groups`).",
    )
    email_claim: str = _field("email", "The ID token claim that names the person (their email).")
    groups_claim: str = _field("groups", "The ID token claim listing the person's groups (or roles).")
    groups: dict[str, str] = _field(
        {},
        "What each of the provider's groups gives: `admin` (llmgw's administrator role), "
        "`project:PROJECT` (membership of that project, by name or id, and so of its team and "
        "organisation), `team:TEAM` or `org:ORG` (membership of a project in that team or "
        "organisation). Applied at every sign-in; a person in none of these groups is refused.",
        OIDC_GRANTS,
    )
    new_users: Literal["active", "pending"] = _field(
        "active", "Whether a person signing in for the first time is active at once or waits for approval."
    )
    local_accounts: bool = _field(
        True, "Whether email and password sign-in still works next to the provider (break-glass)."
    )
    button: str = _field("Sign in with your organisation", "The sign-in button's label.")
    clock_skew_s: float = _field(
        60.0, "How far the provider's clock may be from this one when checking expiry.", seconds(0, high=600)
    )
    timeout_s: float = _field(
        10.0, "How long to wait for the provider's answers.", seconds(0, above=True, high=120)
    )


@attrs.frozen
class SamlConfig:
    idp_metadata: str = _field(
        "",
        "The identity provider's SAML metadata: the path of its XML file, or the http:// or https:// "
        "URL it is published at (read when the server starts). Empty: no sign-in through SAML. See "
        "docs/accounts.md, SAML.",
    )
    base_url: str = _field(
        "",
        "The address people reach the pages at, such as `https://llm.example.com`: the assertion "
        "consumer service URL to register at the provider is this followed by `/login/saml/acs`.",
        http_url(empty_ok=True),
    )
    entity_id: str = _field(
        "",
        "This server's entity id at the provider; empty: `BASE_URL/login/saml/metadata`, where its "
        "metadata is served.",
    )
    email_attribute: str = _field(
        "email", "The assertion's attribute naming the person (their email); empty: the NameID."
    )
    groups_attribute: str = _field(
        "groups", "The assertion's attribute listing the person's groups (or roles)."
    )
    groups: dict[str, str] = _field(
        {},
        "What each of the provider's groups gives, as auth.oidc.groups: `admin`, `project:PROJECT`, "
        "`team:TEAM` or `org:ORG`. Applied at every sign-in; a person in none of these groups is refused.",
        OIDC_GRANTS,
    )
    new_users: Literal["active", "pending"] = _field(
        "active", "Whether a person signing in for the first time is active at once or waits for approval."
    )
    local_accounts: bool = _field(
        True, "Whether email and password sign-in still works next to the provider (break-glass)."
    )
    button: str = _field("Sign in with your organisation (SAML)", "The sign-in button's label.")


@attrs.frozen
class AuthConfig:
    enabled: bool = _field(True, "Require `Authorization: Bearer <key>` on /v1/*.")
    default_rpm: int = _field(
        0,
        "Requests per minute for a key no scope limits; 0 means unlimited.",
        number(0, high=MAX_PER_MINUTE),
    )
    default_tpm: int = _field(
        0,
        "Tokens per minute for a key no scope limits; 0 means unlimited.",
        number(0, high=MAX_PER_MINUTE),
    )
    signup_open: bool = _field(False, "Whether /signup accepts new accounts (pending until approved).")
    session_ttl_s: float = _field(
        43200.0,
        "How long a sign-in to the pages lasts (the session cookie's lifetime), in seconds.",
        seconds(0, above=True),
    )
    disabled_user_keys: Literal["keep", "revoke"] = _field(
        "keep",
        "What disabling an account does to the API keys its owner made on the profile page: "
        "`keep` them working, or `revoke` them.",
    )
    oidc: OidcConfig = _field(OidcConfig(), "Sign-in to the pages through an OpenID Connect provider.")
    saml: SamlConfig = _field(SamlConfig(), "Sign-in to the pages through a SAML 2.0 identity provider.")


@attrs.frozen
class ControlConfig:
    enabled: bool = _field(True, "Run the control plane: the agent service, placement and reconciliation.")
    interval_s: float = _field(
        2.0, "How often the reconciler compares desired and actual replicas.", seconds(0, above=True)
    )
    grace_s: float = _field(
        15.0,
        "How long a node may stay silent before it is marked unreachable; its engines stay in the "
        "routing table while they answer the gateway (`engine_check_s`).",
        seconds(0, above=True),
    )
    engine_check_s: float = _field(
        5.0,
        "How often the gateway asks, itself, the health path of each engine on an unreachable node, "
        "which must answer within as long: one that does not leaves the routing table. "
        "See docs/operations.md.",
        seconds(0, above=True),
    )
    endpoint_check_s: float = _field(
        15.0,
        "How often the server asks each model endpoint outside the fleet (a model's `endpoints`) for "
        "`GET <url>/models` with its key, which must answer within as long; one that fails leaves the "
        "routing table, its state in words on `ctl replicas` and the pages, until a check passes.",
        seconds(0, above=True),
    )
    base_backoff_s: float = _field(
        5.0,
        "First wait before a model is tried again on a node where its replica failed; doubles with each "
        "further failure there (at most 300 s), and other nodes are tried meanwhile.",
        seconds(0, above=True),
    )
    drain_timeout_s: float = _field(
        300.0,
        "How long the replicas of a draining node may finish their in-flight requests "
        "before they are stopped anyway; each is stopped sooner, as soon as it has nothing in flight "
        "and another replica serves its model. See docs/placement.md.",
        seconds(0),
    )
    placement: Literal["spread", "binpack"] = _field(
        "spread",
        "How replicas are laid over candidate nodes: `spread` (fewest replicas first) "
        "or `binpack` (the fullest node that still fits first). See docs/placement.md.",
    )
    name: str = _field(
        "",
        "This control plane's name among several sharing one PostgreSQL `database`, which standbys "
        "name the leader by; empty means the machine's host name. See docs/operations.md.",
    )
    advertise: str = _field(
        "",
        "The address agents reach this control plane's agent service at, which standbys give agents "
        "when they name the leader; empty means `agent_listen` as bound (the host name where it "
        "listens on every address).",
        optional_dial_address("198.18.0.1:7443"),
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
        0,
        "GPUs each node gives one replica; 0 means none, or 1 when `gpu_class` is set.",
        number(0, high=MAX_GPUS_PER_NODE),
    )
    nodes: int = _field(
        1,
        "Nodes one replica spans; more than 1 needs nodes on one fabric.",
        number(1, high=MAX_NODES_PER_REPLICA),
    )
    min_memory_mb: int = _field(
        0,
        "Memory (MB) each node must have free for one replica, counted against the node's total "
        "less what placed replicas claim.",
        number(0, high=MAX_MEMORY_MB),
    )
    labels: dict[str, str] = _field({}, "Labels (agent.yaml `labels`) a node must carry, with these values.")


@attrs.frozen
class TimeoutsConfig:
    connect_s: float = _field(
        10.0,
        "How long the gateway waits for a replica's engine to accept a connection; past it the request "
        "goes to another ready replica, or is a 502.",
        seconds(0, above=True),
    )
    first_byte_s: float = _field(
        120.0,
        "How long the engine may take to send the first byte of its reply, once the request is sent: "
        "generous, since a long prompt's prefill on a big model takes time. Past it the request goes to "
        "another ready replica once, or is a 504 naming this key. See docs/gateway.md, Timeouts.",
        seconds(0, above=True),
    )
    idle_s: float = _field(
        60.0,
        "How long a reply under way may go without a byte from the engine; past it a stream ends with an "
        "error event naming this key.",
        seconds(0, above=True),
    )
    total_s: float = _field(
        600.0,
        "The longest a request may take, from being sent to the engine to its reply's last byte (the "
        "reference implementation's `timeouts.generation`); past it, a 504, or an error event ending a "
        "stream under way.",
        seconds(0, above=True),
    )
    cold_start_s: float = _field(
        0.0,
        "How long a request for an on-demand model (`scale`) with no ready replica is held while one is "
        "placed and started; past it, a 503 saying where the start stands, with Retry-After. 0: sized "
        "for the slowest of its profiles' engines (llamacpp and sim 120 s, vllm and sglang 900 s). See "
        "docs/placement.md, On demand.",
        seconds(0),
    )


@attrs.frozen
class ScaleConfig:
    min: int = _field(
        0,
        "The fewest replicas kept running; 0: none until a request comes, which is held while one starts.",
        number(0, high=MAX_REPLICAS),
    )
    max: int = _field(
        1,
        "The most replicas the load may bring it to; at least `min`.",
        number(1, high=MAX_REPLICAS),
    )
    idle_s: float = _field(
        600.0,
        "After this long without a request, the replicas above `min` are stopped.",
        seconds(0, above=True),
    )
    target_in_flight: float = _field(
        8.0,
        "Requests in flight per ready replica the load is held to: a replica is added when it has stayed "
        "above this for `window_s`, and one removed when the others would have stayed below it.",
        number(0, above=True, high=MAX_IN_FLIGHT),
    )
    window_s: float = _field(
        60.0,
        "How long the load must stay above (or below) the target before a replica is added (or removed).",
        seconds(0, above=True),
    )
    priority: int = _field(
        0,
        "Which on-demand models keep their idle replicas when a model that must start finds no room: "
        "an idle replica of a lower priority is stopped first, the least recently used among equals.",
        number(0, high=MAX_PRIORITY),
    )


@attrs.frozen
class EndpointConfig:
    url: str = _field(
        "",
        "The base URL of an OpenAI-compatible server outside the fleet (`http://10.1.2.3:8000/v1`, "
        "`https://api.example.com/v1`): requests go to `<url>/chat/completions`, `<url>/completions`, "
        "`<url>/embeddings`, and its health is `GET <url>/models`. See docs/endpoints.md.",
        http_url(empty_ok=False),
    )
    model: str = _field(
        "",
        "The name that server knows the model by: each request's `model` is rewritten to it. Empty: "
        "the catalog name.",
    )
    api_key_env: str = _field(
        "",
        "The environment variable of the server process holding the key sent to it as "
        "`Authorization: Bearer`; never shown, logged or returned. Empty, with `api_key_file` empty: "
        "no key is sent.",
    )
    api_key_file: str = _field(
        "",
        "A file (readable by the server only) holding the key, in place of `api_key_env`; read at each "
        "health check, so a rotated key is used within `control.endpoint_check_s`.",
    )


@attrs.frozen
class ModelConfig:
    name: str = _field("", "The model name clients ask for in `model`.")
    replicas: int = _field(
        1,
        "How many replicas to keep running, always: `min` and `max` of `scale` both. Leave it out "
        "with `scale`.",
        number(0, high=MAX_REPLICAS),
    )
    scale: ScaleConfig | None = _field(
        None,
        "Run the model on demand: `min` replicas always, more as the load asks up to `max`, those above "
        "`min` stopped after `idle_s` without a request (`min: 0`: started by the first request, which "
        "is held meanwhile). See docs/placement.md, On demand.",
    )
    profiles: list[ProfileConfig] = _field([], "Ways to run the model, tried in order.")
    version: str = _field("", "The model's version, shown with its name; free text.")
    source: str = _field(
        "",
        "URL of the weights: a file, or a directory when it ends in `/`; `mirror:REPO[@REVISION]` for a "
        "model on the mirror (server.yaml's `mirror`), sent to nodes as the mirror's URL and pins; "
        "empty for engines that need none.",
    )
    sha256: dict[str, str] = _field({}, "Pinned sha256 digests of the weights, by file name.")
    fallbacks: list[str] = _field(
        [],
        "Models to serve a request with, in order, when this one has no ready replica; the reply's "
        "`x-llmgw-model` header names the one that served it.",
    )
    # None, not zeros: a model priced at nothing is free, one without a price takes `pricing` or
    # `default_price`.
    pricing: PriceConfig | None = _field(
        None,
        "This model's price (`prompt_per_1k`, `completion_per_1k`); before server.yaml's `pricing` entry "
        "and `default_price`. How a model added with `llmgw ctl model add` carries its price.",
    )
    kind: Literal["chat", "embeddings", "rerank", "transcription"] = _field(
        "chat",
        "What the model serves: `chat` (/v1/chat/completions, /v1/completions, /v1/messages, "
        "/v1/messages/count_tokens, /v1/responses), `embeddings` (/v1/embeddings), `rerank` (/v1/rerank, "
        "/rerank, /v1/score) or `transcription` (/v1/audio/transcriptions). An embeddings model's engine "
        "starts in its embedding mode (llama-server `--embeddings`, vLLM `--runner pooling`, SGLang "
        "`--is-embedding`; the sim engine serves every kind); a rerank model's llama-server starts with "
        "`--reranking`, and vLLM, SGLang or a transcription model's engine take what they need from the "
        "profile's `args`. A request for another kind "
        "is refused with 400 saying what the model serves. See docs/gateway.md.",
    )
    max_tokens: int = _field(
        4096,
        "The most completion tokens one request for this model may ask for (`max_tokens` or "
        "`max_completion_tokens`, times `n`): a request that names none is sent to the engine with this "
        "many, and one that asks for more is refused with 400. What a request reserves against tpm "
        "limits and budgets until its real usage is known. See docs/gateway.md.",
        number(1, high=MAX_TOKENS),
    )
    timeouts: TimeoutsConfig = _field(
        TimeoutsConfig(),
        "How long the gateway waits on this model's engines, or its endpoints: to connect, for the first "
        "byte, between two bytes of a reply, and in all. See docs/gateway.md, Timeouts.",
    )
    endpoints: list[EndpointConfig] = _field(
        [],
        "Servers outside the fleet that serve this model (any OpenAI-compatible server, a cloud API), in "
        "place of `profiles`: a model has one or the other. Routed to like replicas, checked every "
        "`control.endpoint_check_s`. See docs/endpoints.md.",
    )
    fallback_when_busy: int = _field(
        0,
        "Send a request to the first of `fallbacks` with a ready replica or endpoint when every ready "
        "replica of this model has at least this many requests in flight (and that fallback has one "
        "below it); 0: only when this model has no ready replica.",
        number(0, high=MAX_IN_FLIGHT),
    )


@attrs.frozen
class PriceConfig:
    # Bounded so that the dearest price times the most tokens a request is charged for stays finite:
    # 1e308 made a long prompt cost inf, which no JSON reply can hold.
    prompt_per_1k: float = _field(
        0.0,
        "Price of 1,000 prompt tokens, in the unit budgets are set in.",
        number(0, high=MAX_PRICE_PER_1K),
    )
    completion_per_1k: float = _field(
        0.0,
        "Price of 1,000 completion tokens, in the unit budgets are set in.",
        number(0, high=MAX_PRICE_PER_1K),
    )


@attrs.frozen
class EngineMirrorConfig:
    base_url: str = _field(
        "",
        "An offline mirror of the engines' release downloads, sent to every node in place of the publisher: "
        "`<base_url>/<repo>/releases/download/<tag>/<asset>` (`https://mirror.example/engines/ggml-org/"
        "llama.cpp/releases/download/b11434/llama-b11434-bin-ubuntu-x64.tar.gz`). Empty: nodes download "
        "from the publisher (agent.yaml's `provision.download_url`).",
        http_url(empty_ok=True),
    )
    checksums: dict[str, str] = _field(
        {},
        "Release asset name -> `sha256:<hex>`, sent to every node in place of the publisher's digests: "
        "with any set, no node asks the publisher's release API. An asset not listed is refused, "
        "never installed unchecked.",
        ASSET_DIGESTS,
    )


@attrs.frozen
class MonitoringConfig:
    window_s: float = _field(
        21600.0,
        "How far back the history charts on the cluster and models pages reach, in seconds (6 h): the "
        "gateway keeps one sample every 10 s for this long, in memory. See docs/monitoring.md.",
        seconds(10),
    )


@attrs.frozen
class LogConfig:
    requests: bool = _field(
        False,
        "Log one line per request to the gateway's proxied routes (every API): its x-request-id, route, "
        "key prefix, project, model, served model, node, status, tokens, latency and time to first byte. "
        "See docs/monitoring.md.",
    )


@attrs.frozen
class MirrorClientConfig:
    api: str = _field(
        "",
        "The mirror's admin listener (`https://models.internal:8082`), through which `llmgw ctl mirror` "
        "and /admin/mirror list, fetch and delete models. Empty: no mirror.",
        http_url(empty_ok=True),
    )
    url: str = _field(
        "",
        "Where nodes fetch the mirror's files (`http://models.internal:8081`): a model whose `source` "
        "is `mirror:REPO[@REVISION]` is fetched from `<url>/files/REPO/COMMIT/`.",
        http_url(empty_ok=True),
    )
    tls: TLSConfig = _field(
        TLSConfig(),
        "The control plane's client certificate for the mirror's admin listener (its common name is "
        "mirror.yaml's `control_plane`), and the authority that signed the mirror's.",
    )


@attrs.frozen
class RouterConfig:
    policy: Literal["least_in_flight", "affinity", "prefix"] = _field(
        "prefix",
        "How the gateway picks a model's replica: `least_in_flight` (the fewest requests in flight), "
        "`affinity` (a request with a session key goes to its session's replica, see `session_load_factor`; "
        "one without, the fewest in flight) or `prefix` (affinity for a request with a session key; one "
        "without goes to the replica that most recently served the longest start of its prompt). "
        "See docs/gateway.md, Routing.",
    )
    session_load_factor: float = _field(
        1.25,
        "How far above the mean load (requests in flight, this one counted) a session's or prefix's "
        "replica may be and still be chosen, and never less than one request above it; over it a "
        "session goes to the next replica on the hash ring and stays there, a prefix to a shorter "
        "prefix's replica or the fewest in flight.",
        number(1, high=1000, unit="1 keeps every replica within a request of the mean"),
    )
    session_headers: list[str] = _field(
        ["x-llmgw-session", "x-session-id"],
        "Request headers that carry a session key, tried in order before the body's `user` field.",
    )
    session_from_user: bool = _field(
        True, "Whether the OpenAI `user` field of the request body is a session key when no header gives one."
    )
    prefix_index_entries: int = _field(
        65536,
        "How many prompt prefixes the `prefix` policy remembers (one per message of a chat, one per "
        "1,024 characters of a completion's prompt), for all models together; the least recently "
        "served are forgotten first. About 80 bytes each (5 MiB at the default).",
        number(1, high=100_000_000),
    )


@attrs.frozen
class ServerConfig:
    listen: str = _field(
        "127.0.0.1:8080",
        "Gateway address (host:port): /v1/*, /health and the pages.",
        listen_address("127.0.0.1:8080"),
    )
    admin_listen: str = _field(
        "127.0.0.1:9090",
        "Admin listener (host:port), for this machine only.",
        listen_address("127.0.0.1:9090"),
    )
    metrics_listen: str = _field(
        "",
        "An address (host:port) serving Prometheus metrics at /metrics and nothing else, for a scraper "
        "on another machine. Empty: none; the admin listener serves /metrics either way. "
        "See docs/monitoring.md.",
        optional_listen_address("0.0.0.0:9100"),
    )
    admin_tokens: list[str] = _field(
        [],
        "sha256 digests (hex) of the tokens that may use the admin API from elsewhere: "
        "`llmgw ctl --server URL --token TOKEN` against /admin on `listen`. `llmgw ctl new-token` makes one.",
        TOKEN_DIGESTS,
    )
    agent_listen: str = _field(
        "127.0.0.1:7443",
        "Agent service address (host:port), gRPC over mutual TLS.",
        listen_address("127.0.0.1:7443"),
    )
    weights_listen: str = _field(
        "",
        "Address (host:port) nodes fetch the models whose `source` is a file or directory on this "
        "machine from, over HTTP, each file checked against the sha256 taken at `llmgw ctl model add`. "
        "Empty: `agent_listen`'s host, on a free port kept over restarts (in `state_dir`). Nodes are "
        "sent the host of `control.advertise` when set (else the host name, where it listens on every "
        "address). See docs/weights.md.",
        optional_listen_address("0.0.0.0:7444"),
    )
    state_dir: str = _field("/var/lib/llmgw", "Directory for the store and other state.")
    database: str = _field(
        "",
        "The store: the path of an SQLite file (empty means `<state_dir>/llmgw.db`), or "
        "`postgresql://USER[:PASSWORD]@HOST[:PORT]/DATABASE` for a PostgreSQL database that several "
        "control planes may share. See docs/operations.md.",
        DATABASE,
    )
    drain_timeout_s: float = _field(
        10.0, "How long a stopping server waits for in-flight requests.", seconds(0)
    )
    tls: TLSConfig = _field(TLSConfig(), "Certificates of the agent service (mutual TLS).")
    auth: AuthConfig = _field(AuthConfig(), "Who may call the gateway.")
    control: ControlConfig = _field(ControlConfig(), "The control plane.")
    router: RouterConfig = _field(RouterConfig(), "How the gateway chooses a model's replica.")
    models: list[ModelConfig] = _field([], "The model catalog.")
    engines: dict[str, str] = _field(
        {},
        "Engines every node installs, by name, at a version (`llamacpp: b11434`). llama.cpp defaults to "
        '`b11434`, the build this release was checked against; an empty version (`llamacpp: ""`) '
        "removes an engine; `sim` is built in and never listed. See docs/provisioning.md.",
    )
    mirror: MirrorClientConfig = _field(
        MirrorClientConfig(), "The model mirror this control plane administers. See docs/mirror.md."
    )
    engine_mirror: EngineMirrorConfig = _field(
        EngineMirrorConfig(),
        "Where nodes install engines from on a site that cannot reach the publisher. "
        "See docs/provisioning.md, Offline sites.",
    )
    pricing: dict[str, PriceConfig] = _field(
        {},
        "Prices per model: `MODEL: {prompt_per_1k: P, completion_per_1k: C}`; budgets are counted in them.",
    )
    default_price: PriceConfig = _field(
        PriceConfig(), "Price of a model `pricing` does not name; both 0 means such a model has no price."
    )
    log: LogConfig = _field(LogConfig(), "What the server logs besides its own events.")
    monitoring: MonitoringConfig = _field(MonitoringConfig(), "The history the pages chart.")
    usage_sync_s: float = _field(
        1.0,
        "How often the usage journal (`usage-journal/` beside the store's database) is synced to disk, "
        "in seconds. A request's usage reaches the journal before its last bytes reach the client, so a "
        "killed server loses none; a power loss may lose what the last interval journaled. "
        "See docs/gateway.md.",
        seconds(0, above=True),
    )

    def problem_across_keys(self) -> tuple[list[str], str] | None:
        """(the keys, why) when keys each allowed alone are not together: two listeners on one port.

        Without it the second listener failed to bind after the first had started, saying another
        program held the port.
        """
        every = ("", "0.0.0.0", "[::]")
        taken: list[tuple[str, str, str]] = []
        for key in ("listen", "admin_listen", "agent_listen"):
            host, _, port = getattr(self, key).rpartition(":")
            if port == "0":
                continue  # each takes a free port of its own
            for other, other_host, other_port in taken:
                if port == other_port and (host == other_host or host in every or other_host in every):
                    return [other, key], (
                        f"'{other}' ({getattr(self, other)}) and '{key}' ({getattr(self, key)}) take the "
                        "same port; give each listener its own"
                    )
            taken.append((key, host, port))
        return None

    @property
    def database_path(self) -> Path:
        """The SQLite file of the store (meaningless when `database` names PostgreSQL)."""
        return Path(self.database) if self.database else Path(self.state_dir) / "llmgw.db"

    @property
    def store(self) -> Path | str:
        """What the store is opened from: the PostgreSQL URL, or the SQLite file."""
        return self.database if is_postgres_url(self.database) else self.database_path

    @property
    def usage_journal_dir(self) -> Path:
        """Beside the SQLite file, or in state_dir when the store is PostgreSQL: each server its own."""
        base = Path(self.state_dir) if is_postgres_url(self.database) else self.database_path.parent
        return base / "usage-journal"


@attrs.frozen
class EngineOptions:
    binary: str = _field(
        "", "Path of an engine binary built by hand; the agent then never installs this engine."
    )
    parallel: int = _field(
        4,
        "Requests the engine serves at once (llama.cpp's `-np`, vLLM's `--max-num-seqs`, SGLang's "
        "`--max-running-requests`), for a replica whose profile sets none.",
        number(1, high=MAX_PARALLEL),
    )
    disabled: bool = _field(
        False, "This node never installs nor reports the engine, so placement sends it none of its replicas."
    )
    index_url: str = _field(
        "",
        "For an engine the agent installs with pip (vLLM): a site's own package index (a PyPI mirror, "
        "`https://pypi.internal/simple`), asked instead of PyPI and the engine's extra indexes (PyTorch's). "
        "Empty: PyPI and those. See docs/provisioning.md.",
        http_url(empty_ok=True),
    )
    wheelhouse: str = _field(
        "",
        "For an engine the agent installs with pip: a directory of its wheels, or the URL of a page "
        "listing them; pip then asks no index at all (an offline node). Takes precedence over `index_url`.",
        WHEELHOUSE,
    )


_NO_OPTIONS = EngineOptions()


def _disabled_list(value: Any) -> Any:
    """`engines: {disabled: [vllm]}`, as llmgw read it before each engine had its own settings.

    Read as `vllm: {disabled: true}`, so that an agent.yaml written then still loads.
    """
    if not isinstance(value, dict) or not isinstance(value.get("disabled"), list):
        return value
    kinds = dict(value)
    for name in kinds.pop("disabled"):
        options = kinds.get(name, {})
        if isinstance(name, str) and isinstance(options, dict):
            kinds[name] = {**options, "disabled": True}
    return kinds


@attrs.frozen
class ProvisionConfig:
    dir: str = _field("", "Directory engines are installed under; empty means `<state_dir>/engines`.")
    api_url: str = _field(
        "https://api.github.com",
        "Release API the checksums of engine builds are read from (GitHub's, or one shaped like it).",
        http_url(empty_ok=False),
    )
    download_url: str = _field(
        "https://github.com",
        "Where engine builds are downloaded from: `<download_url>/<repo>/releases/download/<tag>/<asset>`.",
        http_url(empty_ok=False),
    )


@attrs.frozen
class ProbeConfig:
    interval_s: float = _field(
        5.0,
        "How often the agent asks each ready engine its health path and reads its metrics page. "
        "See docs/operations.md (Stalled engines).",
        seconds(0, above=True, high=3600),
    )
    timeout_s: float = _field(
        5.0,
        "How long one health probe may take before it counts as a failure: a stopped engine's kernel "
        "still accepts the connection, so only a timeout tells it from a busy one.",
        seconds(0, above=True, high=3600),
    )
    failures: int = _field(
        3,
        "Health probes failed in a row after which the engine is stalled, killed and replaced.",
        number(1, high=1000),
    )
    progress_s: float = _field(
        60.0,
        "How long an engine may hold requests in flight while its token counters do not move before it "
        "is stalled, killed and replaced; 0 turns this check off. Read from the engine's metrics page "
        "(llama.cpp, vLLM and the sim expose the counters; others are probed for health only).",
        seconds(0),
    )


@attrs.frozen
class AgentConfig:
    node_id: str = _field("", "This node's id; must equal the common name of its certificate.")
    servers: list[str] = _field(
        ["127.0.0.1:7443"],
        "Agent service addresses (host:port), tried in order.",
        dial_address("127.0.0.1:7443"),
    )
    state_dir: str = _field("/var/lib/llmgw-agent", "Directory for the agent's state and installed engines.")
    weights_cache: str = _field("", "Directory for model weights; empty means `<state_dir>/weights`.")
    heartbeat_interval_s: float = _field(
        5.0,
        "At most how long between the agent's heartbeats (each goes up to a fifth early, at random, "
        "so nodes do not beat together). Changes go at once whatever this is; see docs/operations.md.",
        seconds(0, above=True, high=3600),
    )
    metrics_listen: str = _field(
        "",
        "An address (host:port) serving this node's Prometheus metrics at /metrics, its engines' own "
        "re-exported with `model`, `replica` and `node` labels. Empty: none. See docs/monitoring.md.",
        optional_listen_address("0.0.0.0:9101"),
    )
    ready_timeout_s: float = _field(
        0.0,
        "How long an engine may take, once started, to answer its health check. 0: each engine's "
        "own (llamacpp and sim 120 s, vllm and sglang 600 s); a value here holds for every engine.",
        seconds(0),
    )
    probe: ProbeConfig = _field(
        ProbeConfig(),
        "How a ready engine is watched: one that stops answering its health path, or holds requests "
        "without producing a token, is reported stalled, killed and started again.",
    )
    tls: TLSConfig = _field(
        TLSConfig(), "This node's certificate and the authority that signed the server's."
    )
    labels: dict[str, str] = _field({}, "Labels placement profiles can require.")
    engines: dict[str, EngineOptions] = _field(
        {},
        "Each engine's settings on this node, by its kind (`llamacpp:`, `vllm:`, `sglang:`, `sim:`); "
        "an engine not named has the defaults. `disabled: [vllm]` here, the shape earlier releases "
        "read, still means `vllm: {disabled: true}`. See docs/engines.md.",
        ENGINE_KINDS,
        older=_disabled_list,
    )
    provision: ProvisionConfig = _field(ProvisionConfig(), "Where the agent installs engines from, and to.")
    fabric: str = _field(
        "",
        "InfiniBand fabric this node is attached to; nodes given the same name can host one "
        "multi-node replica together. Empty: no fabric, single-node replicas only.",
    )
    hcas: list[str] = _field(
        [], "The fabric's HCAs (e.g. `mlx5_0`); empty means every HCA under /sys/class/infiniband."
    )
    model_dirs: list[str] = _field(
        [], "Other directories weights live in (an NFS export, local NVMe); their free space is reported."
    )
    keep_engines_on_stop: bool = _field(
        True,
        "Leave engines running when the agent stops, for the next agent to adopt "
        "(see [weights.md](weights.md#agent-restarts)); `--dev` always stops them.",
    )
    advertise_address: str = _field(
        "",
        "The address of this node the control plane's gateway reaches its engines at: the endpoint of "
        "every replica here. Empty: the local address of the agent's own connection to the control "
        "plane (on a single host, 127.0.0.1). Must be an IP address of this machine.",
        check=_OWN_ADDRESS,
    )
    engine_bind: str = _field(
        "",
        "The address engines listen on. Empty: the advertised address; `0.0.0.0` or `::` for every "
        "address of the machine. Otherwise an IP address of this machine.",
        check=Check("empty, 0.0.0.0, :: or an IP address of this machine", addresses.bind_address_problem),
    )
    engine_ports: str = _field(
        addresses.DEFAULT_ENGINE_PORTS,
        "The ports engines listen on, `FIRST-LAST`, so a firewall can name them: only the control plane's "
        "gateway hosts need to reach them. A replica that finds no free port there fails, saying so.",
        check=Check("FIRST-LAST, ports 1-65535", addresses.port_range_problem),
    )
    fabric_address: str = _field(
        "",
        "This node's address on its fabric's management network, where the other nodes of a multi-node "
        "replica reach its rank 0. Empty: the advertised address. Must be an IP address of this machine.",
        check=_OWN_ADDRESS,
    )

    def engine_options(self, kind: str) -> EngineOptions:
        """What agent.yaml says of the engine kind: its settings, or the defaults where it says nothing."""
        return self.engines.get(kind, _NO_OPTIONS)

    @property
    def engines_dir(self) -> Path:
        return Path(self.provision.dir) if self.provision.dir else Path(self.state_dir) / "engines"

    @property
    def weights_dir(self) -> Path:
        return Path(self.weights_cache) if self.weights_cache else Path(self.state_dir) / "weights"


@attrs.frozen
class MirrorConfig:
    listen: str = _field(
        "127.0.0.1:8081",
        "Address (host:port) the mirror serves model files on.",
        listen_address("127.0.0.1:8081"),
    )
    root: str = _field("/var/lib/llmgw-mirror", "Directory whose files the mirror serves.")
    hf_endpoint: str = _field(
        "https://huggingface.co",
        "The Hugging Face–compatible hub `llmgw mirror fetch` downloads model repositories from.",
        http_url(empty_ok=False),
    )
    hf_token_file: str = _field(
        "",
        "File holding the hub's access token, for gated and private repositories. "
        "Empty reads HF_TOKEN from the environment, and no token when that is unset too.",
    )
    admin_listen: str = _field(
        "",
        "Address (host:port) of the admin listener, over mutual TLS, that the control plane lists, "
        "fetches and deletes models through (0.0.0.0:8082 by convention). Empty: no admin listener.",
        optional_listen_address("0.0.0.0:8082"),
    )
    admin_tls: TLSConfig = _field(
        TLSConfig(),
        "Certificates of the admin listener: `ca` signed the control plane's client certificate; "
        "`cert` and `key` are the mirror's own.",
    )
    control_plane: str = _field(
        "",
        "Common name of the one client certificate the admin listener accepts, the control plane's. "
        "The authority signs every node's certificate too, and a node must not delete models.",
    )
