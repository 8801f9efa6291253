"""The live catalog: the models declared in server.yaml, and those added while running.

server.yaml's models are there on every start and are its to change: ctl can
neither remove nor shadow one, because a restart would bring the file's
version back and an operator would not know which one serves. Models added
with `llmgw ctl model add` are kept in the store (store/catalog.py) and come
back on the next start.

The server role builds this one object and passes it down: the reconciler,
placement, the admin API, the gateway's /v1/models, its prices and its routing
all read it, so a model added here is placed, listed and routed to without a
restart; `subscribe` is how the reconciler hears of a change at once instead
of at its next interval. It sits below both the gateway and the control plane
(with what a model definition must hold, and server.yaml's loading) so that
the gateway needs nothing of the control plane's.
"""

from __future__ import annotations

import asyncio
import re
import urllib.parse
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path, PurePosixPath
from typing import Any

import structlog
from aiohttp import web

from llmgw import config, localsource, names, weightsformat
from llmgw.config import ModelConfig, ServerConfig
from llmgw.config.editing import with_section
from llmgw.engines.base import profile_args_problem
from llmgw.engines.registry import ENGINES
from llmgw.errors import ConfigError, LlmgwError
from llmgw.hubref import SOURCE_PREFIX, RefError, parse_ref
from llmgw.store import Store
from llmgw.store import catalog as stored

log = structlog.get_logger(__name__)

SERVER_YAML = "server.yaml"
ADDED = "ctl"


class UnknownModel(LlmgwError):
    """No model of that name is in the catalog."""


class DeclaredModel(LlmgwError):
    """The model is declared in server.yaml, which ctl does not change."""


class Catalog:
    """Every model the server serves: server.yaml's first, then the added ones by name."""

    def __init__(
        self,
        cfg: ServerConfig,
        store: Store | None = None,
        added: Sequence[ModelConfig] = (),
        unreadable: Sequence[str] = (),
        texts: Mapping[str, str] | None = None,
    ) -> None:
        """texts: each stored model's definition as the store holds it, so `reload` parses only changes."""
        self._declared = {m.name: m for m in cfg.models}
        self._added = {m.name: m for m in added if m.name not in self._declared}
        self._texts = dict(texts or {})
        # Stored models this release refuses (a name no longer allowed, say): not served, but
        # `ctl model remove` must still be able to take them out of the store.
        self._unreadable = set(unreadable)
        self._store = store
        self._listeners: list[Callable[[], None]] = []
        self._models: tuple[ModelConfig, ...] = ()
        self._by_name: dict[str, ModelConfig] = {}
        # Bumped on every change, so readers can keep what they derive until it moves.
        self.generation = 0
        self.changed = asyncio.Event()
        self._rebuild()

    @classmethod
    async def open(cls, cfg: ServerConfig, store: Store) -> Catalog:
        """The catalog of cfg plus the models the store kept; one that cannot be read is logged, skipped."""
        declared = {m.name for m in cfg.models}
        added, unreadable = [], []
        rows = await stored.list_models(store)
        for row in rows:
            if row.name in declared:
                log.warning(
                    "a model added with `llmgw ctl model add` is now declared in server.yaml; "
                    "server.yaml's definition is used",
                    model=row.name,
                )
                continue
            try:
                added.append(await asyncio.to_thread(parse_model, row.definition, row.source))
            except ConfigError as exc:
                # One stored model this release can no longer read must not keep every other from serving.
                log.error(
                    "a model added with `llmgw ctl model add` cannot be read; it is not served",
                    model=row.name,
                    error=str(exc),
                )
                unreadable.append(row.name)
        cfg = config.evolve(cfg, models=[await pinned(m) for m in cfg.models])
        return cls(cfg, store, added, unreadable, {r.name: r.definition for r in rows})

    def models(self) -> Sequence[ModelConfig]:
        return self._models

    def names(self) -> list[str]:
        return [m.name for m in self._models]

    def get(self, name: str) -> ModelConfig | None:
        return self._by_name.get(name)

    def origin(self, name: str) -> str:
        """Where the model was declared: "server.yaml" or "ctl"; "" when it is not in the catalog."""
        if name in self._declared:
            return SERVER_YAML
        return ADDED if name in self._added else ""

    def subscribe(self, listener: Callable[[], None]) -> None:
        """Call listener after every change."""
        self._listeners.append(listener)

    async def add(self, text: str, source: str) -> tuple[ModelConfig, bool]:
        """Add the model text defines, or replace one added before; (model, whether it replaced one).

        ConfigError naming source, line and key for a definition that cannot be used; DeclaredModel
        for a name server.yaml declares.
        """
        # In a thread: ruamel.yaml looks for its plugins on disk the first time it is used.
        model = await asyncio.to_thread(parse_model, text, source)
        if model.name in self._declared:
            raise DeclaredModel(
                f"{model.name} is declared in server.yaml; change it there and restart "
                "(a model of the same name cannot be added with ctl)"
            )
        if localsource.is_local(model.source):
            # Pinned now, and the pins kept with the definition: a file changed on the disk later is
            # refused by the nodes, and a restart does not pin the changed file as if it were the model.
            model = await pinned(model, source)
            text = await asyncio.to_thread(with_section, ModelConfig, text, source, "sha256", model.sha256)
        replaced = model.name in self._added
        if self._store is not None:
            await stored.put_model(self._store, model.name, text, source)
        self._added[model.name] = model
        self._texts[model.name] = text
        self._unreadable.discard(model.name)
        log.info("model added to the catalog", model=model.name, replaced=replaced, source=source)
        self._rebuild()
        return model, replaced

    async def remove(self, name: str) -> str:
        """Remove a model added with ctl, and say its name; its replicas are stopped by the reconciler."""
        if name in self._declared:
            raise DeclaredModel(
                f"{name} is declared in server.yaml; remove it there and restart (ctl removes only "
                "models added with `llmgw ctl model add`)"
            )
        if name in self._unreadable and name not in self._added:
            if self._store is not None:
                await stored.delete_model(self._store, name)
            self._unreadable.discard(name)
            log.info("a stored model that could not be read was removed", model=name)
            return name
        model = self._added.get(name)
        if model is None:
            known = ", ".join(self._added) or "none"
            raise UnknownModel(f"no model {name} was added with ctl (added with ctl: {known})")
        if self._store is not None:
            await stored.delete_model(self._store, name)
        del self._added[name]
        self._texts.pop(name, None)
        log.info("model removed from the catalog", model=name)
        self._rebuild()
        return name

    async def reload(self) -> bool:
        """Follow the store: what another server sharing it added, replaced or removed; whether any.

        With several control planes on one PostgreSQL, `ctl model add` on one of them changes the
        store only: the leader must place the model, and every standby's gateway route to it.
        """
        if self._store is None:
            return False
        rows = {r.name: r for r in await stored.list_models(self._store) if r.name not in self._declared}
        changed = False
        for name in [n for n in self._added if n not in rows]:
            del self._added[name]
            changed = True
            log.info("a model removed on another control plane left the catalog", model=name)
        for name in [n for n in self._texts if n not in rows]:
            del self._texts[name]
        self._unreadable &= set(rows)
        for name, row in rows.items():
            if self._texts.get(name) == row.definition:
                continue
            self._texts[name] = row.definition
            try:
                model = await asyncio.to_thread(parse_model, row.definition, row.source)
            except ConfigError as exc:
                log.error("a model added on another control plane cannot be read", model=name, error=str(exc))
                self._unreadable.add(name)
                changed = self._added.pop(name, None) is not None or changed
                continue
            self._added[name] = model
            self._unreadable.discard(name)
            changed = True
            log.info("a model added on another control plane joined the catalog", model=name)
        if changed:
            self._rebuild()
        return changed

    def _rebuild(self) -> None:
        self._models = (*self._declared.values(), *(self._added[n] for n in sorted(self._added)))
        self._by_name = {m.name: m for m in self._models}
        self.generation += 1
        self.changed.set()
        for listener in self._listeners:
            listener()


# The live catalog on an aiohttp app: the gateway's and the admin API's.
CATALOG_KEY = web.AppKey("llmgw.catalog", Catalog)


def parse_model(text: str, source: str) -> ModelConfig:
    """One model definition (YAML or JSON), or ConfigError saying what is wrong, in source at which line."""
    model = config.parse(ModelConfig, text, source)
    if not model.name:
        raise ConfigError(f"{source}: the model has no 'name'; clients ask for it by that name")
    _check_model(model, _Where(text, source), [])
    return model


async def pinned(model: ModelConfig, where: str = SERVER_YAML) -> ModelConfig:
    """model with its local source's files pinned, when it has one; ConfigError when they cannot be.

    Hashing reads every byte of the weights: in a thread, minutes for a large model.
    """
    path = localsource.local_path(model.source)
    if path is None:
        return model
    pins = await asyncio.to_thread(_pin_checked, model, path, where)
    return config.evolve(model, sha256=pins)


def _pin_checked(model: ModelConfig, path: Path, where: str) -> dict[str, str]:
    try:
        pins = localsource.pin(path)
    except OSError as exc:
        raise ConfigError(
            f"{where}: {model.name}'s source {path} cannot be read: {exc.strerror or exc}"
        ) from None
    except ConfigError as exc:
        raise ConfigError(f"{where}: {model.name}'s source: {exc}") from None
    problem = localsource.mismatch(model.sha256, pins)
    if problem is not None:
        raise ConfigError(f"{where}: {model.name}: {problem}")
    fmt = weightsformat.format_of(pins)
    refused = weightsformat.engine_problem(model, fmt) if fmt is not None else None
    if refused is not None:
        raise ConfigError(f"{where}: {model.name}: {refused[1]}")
    return pins


def check_declared(cfg: ServerConfig, text: str, source: str) -> None:
    """Hold server.yaml's models to what `ctl model add` holds a model to; ConfigError at the first fault.

    Without this a model with a misspelt engine started quietly and was never placed, and the only
    sign was a model stuck pending; a server refusing to start says which line to fix.
    """
    where = _Where(text, source)
    for i, model in enumerate(cfg.models):
        if not model.name:
            raise ConfigError(
                f"{where(['models', i])}: models[{i}] has no 'name'; clients ask for it by that name"
            )
        _check_model(model, where, ["models", i])


def load_server_config(path: Path) -> ServerConfig:
    """server.yaml, read and structured, its models checked as `llmgw ctl model add` checks one."""
    cfg = config.load(ServerConfig, path)
    check_declared(cfg, path.read_text(encoding="utf-8"), str(path))
    return cfg


def _check_model(model: ModelConfig, where: _Where, at: list[Any]) -> None:
    def key(*path: Any) -> str:
        return config.dotted([*at, *path])

    def line(*path: Any) -> str:
        return where([*at, *path])

    # Checked first: the name becomes a shard id, a log file's name, an engine's argument and a URL.
    problem = names.model_name_problem(model.name)
    if problem is not None:
        raise ConfigError(f"{line('name')}: {problem}")
    if model.endpoints:
        _check_endpoints(model, line, key)
    elif not model.profiles:
        raise ConfigError(
            f"{line('profiles')}: {model.name} has no profile; add one under 'profiles' (its engine, at "
            "least) so it can be placed, or name the servers that serve it under 'endpoints'"
        )
    seen: set[str] = set()
    for i, profile in enumerate(model.profiles):
        if profile.engine not in ENGINES:
            raise ConfigError(
                f"{line('profiles', i, 'engine')}: '{key('profiles', i, 'engine')}' is {profile.engine!r}; "
                f"expected one of {', '.join(sorted(ENGINES))}"
            )
        if profile.name in seen:
            raise ConfigError(
                f"{line('profiles', i, 'name')}: two profiles are called {profile.name!r}; "
                "give each its own 'name'"
            )
        seen.add(profile.name)
        problem = names.profile_name_problem(profile.name)
        if problem is not None:
            raise ConfigError(f"{line('profiles', i, 'name')}: {problem}")
        problem = profile_args_problem(ENGINES[profile.engine], profile.args)
        if problem is not None:
            raise ConfigError(f"{line('profiles', i, 'args')}: '{key('profiles', i, 'args')}': {problem}")
    _check_source(model, line, key)
    _check_format(model, line)
    if model.name in model.fallbacks:
        i = model.fallbacks.index(model.name)
        raise ConfigError(f"{line('fallbacks', i)}: {model.name} cannot be its own fallback")
    _check_scale(model, line)


def _check_scale(model: ModelConfig, line: Callable[..., str]) -> None:
    """`scale` within itself, and not beside a `replicas` that would say another count."""
    scale = model.scale
    if scale is None:
        return
    if scale.max < scale.min:
        raise ConfigError(
            f"{line('scale', 'max')}: {model.name}'s scale.max ({scale.max}) is below its scale.min "
            f"({scale.min}); max is the most replicas the load may bring it to"
        )
    if model.replicas != 1:
        # replicas: N means min = max = N: with scale beside it, one of the two would be ignored.
        raise ConfigError(
            f"{line('replicas')}: {model.name} has both 'replicas' and 'scale'; keep 'scale' "
            "(replicas: N is scale min N, max N)"
        )
    if model.endpoints:
        raise ConfigError(
            f"{line('scale')}: {model.name} is served by its 'endpoints', which the fleet does not start "
            "or stop: 'scale' is for models placed on the fleet"
        )


def _check_endpoints(model: ModelConfig, line: Callable[..., str], key: Callable[..., str]) -> None:
    """Endpoints in place of profiles, each with a URL and at most one way to its key; or say why not."""
    if model.profiles:
        # Placed on the fleet and sent elsewhere too, its replicas and endpoints would be two
        # models under one name, with one set of timeouts and limits: the operator picks one.
        raise ConfigError(
            f"{line('endpoints')}: {model.name} has both 'profiles' (replicas placed on the fleet) and "
            "'endpoints' (servers outside it); a model has one or the other: make the other a model of "
            "its own and name it in 'fallbacks'"
        )
    for i, endpoint in enumerate(model.endpoints):
        parsed = urllib.parse.urlsplit(endpoint.url)
        if parsed.scheme not in ("http", "https") or not parsed.netloc:
            raise ConfigError(
                f"{line('endpoints', i, 'url')}: '{key('endpoints', i, 'url')}' is {endpoint.url!r}; "
                "expected the http:// or https:// base URL of an OpenAI-compatible server, such as http://10.1.2.3:8000/v1"
            )
        if parsed.query or parsed.fragment or parsed.username or parsed.password:
            # A key in the URL would be shown wherever the URL is: it goes in api_key_env or api_key_file.
            raise ConfigError(
                f"{line('endpoints', i, 'url')}: '{key('endpoints', i, 'url')}' must be a plain base URL, "
                "without a query, a fragment or credentials: put its key in 'api_key_env' or 'api_key_file'"
            )
        if endpoint.api_key_env and endpoint.api_key_file:
            raise ConfigError(
                f"{line('endpoints', i, 'api_key_file')}: endpoint {i} of {model.name} names both "
                "'api_key_env' and 'api_key_file'; keep the one that holds its key"
            )


def _check_format(model: ModelConfig, line: Callable[..., str]) -> None:
    """Refuse a profile whose engine does not load the weights a source names by its file name.

    A directory's format is known from its files: the mirror's are checked by the admin API, a
    local one's when it is pinned.
    """
    path = localsource.local_path(model.source)
    name = path.as_posix() if path is not None else urllib.parse.urlsplit(model.source).path
    fmt = weightsformat.format_of_name(name) if model.source else None
    refused = weightsformat.engine_problem(model, fmt) if fmt is not None else None
    if refused is not None:
        i, why = refused
        raise ConfigError(f"{line('profiles', i, 'engine')}: {why}")


def _check_source(model: ModelConfig, line: Callable[..., str], key: Callable[..., str]) -> None:
    """A source every agent can fetch (agent/weights.py), and pins it can check, or say why not."""
    if model.source.startswith(SOURCE_PREFIX):
        try:
            parse_ref(model.source.removeprefix(SOURCE_PREFIX))
        except RefError as exc:
            raise ConfigError(f"{line('source')}: '{key('source')}' is {model.source!r}: {exc}") from None
        if model.sha256:
            # The mirror's pins are the hub's own, for the commit it holds; a second set could only disagree.
            raise ConfigError(
                f"{line('sha256')}: {model.name} takes its weights from the mirror, whose pins nodes "
                "check; remove 'sha256'"
            )
        return
    path = localsource.local_path(model.source)
    if path is not None:
        if not path.is_absolute() or ".." in path.parts:
            raise ConfigError(
                f"{line('source')}: '{key('source')}' is {model.source!r}; a path on the server "
                "must be absolute, without '..'"
            )
    elif model.source:
        parsed = urllib.parse.urlsplit(model.source)
        if parsed.scheme not in ("http", "https") or not parsed.netloc:
            raise ConfigError(
                f"{line('source')}: '{key('source')}' is {model.source!r}; expected a file or directory "
                "on the server (/srv/models/model.gguf, file:///srv/models/Qwen2.5-0.5B), "
                "`mirror:ORG/MODEL[@REVISION]` for a model on the mirror, or the http:// or https:// "
                "URL of a file, or of a directory ending in '/'"
            )
        # ".." would be the weights cache's parent on the node, not a file in it.
        if not model.source.endswith("/") and PurePosixPath(parsed.path).name in ("", ".."):
            raise ConfigError(
                f"{line('source')}: '{key('source')}' is {model.source!r}, which names no file; "
                "a directory's URL must end in '/'"
            )
    elif model.sha256:
        raise ConfigError(
            f"{line('sha256')}: {model.name} pins a sha256 but has no 'source' to check it against"
        )
    for name, digest in model.sha256.items():
        if not _SHA256.fullmatch(digest.removeprefix("sha256:").strip().lower()):
            raise ConfigError(
                f"{line('sha256', name)}: '{key('sha256', name)}' is {digest!r}; "
                "expected 64 hexadecimal digits (`sha256sum FILE` prints them)"
            )


_SHA256 = re.compile(r"[0-9a-f]{64}")


class _Where:
    """ "model.yaml:7" for a key path of the text, as far as the text has it."""

    def __init__(self, text: str, source: str) -> None:
        self._source = source
        try:
            self._root: Any = config.read_yaml(text, source)
        except ConfigError:
            self._root = None

    def __call__(self, path: list[Any]) -> str:
        return config.where(self._source, self._root, path)
