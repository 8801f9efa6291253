"""The mirror's admin listener: the control plane lists, fetches and deletes models here, over mutual TLS.

This listener can delete models and start downloads of any size, so it
answers one client only: the certificate whose common name is mirror.yaml's
`control_plane`. Being signed by the authority is not enough: the same
authority signs every node's certificate.

Routes (JSON):
  GET    /api/v1/models                      every model on the mirror, its files, sizes and pins
  POST   /api/v1/fetches {"model", "include"} start fetching REPO[@REVISION]; 202 with the fetch
  GET    /api/v1/fetches                     every fetch since the mirror started, newest first
  GET    /api/v1/fetches/{id}                one fetch: running, done or failed; its progress or error
  DELETE /api/v1/models?model=REPO@COMMIT    delete a model (409 while a fetch of it runs)
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Literal

import attrs
import cattrs
import structlog
from aiohttp import web
from aiohttp.typedefs import Handler, Middleware

from llmgw import strictjson
from llmgw.bodies import BadJson, read_json
from llmgw.config import MirrorConfig
from llmgw.errors import ConfigError
from llmgw.hubref import RefError, parse_ref
from llmgw.listen import cannot_listen, split_host_port
from llmgw.mirror.fetch import (
    FetchedModel,
    FetchError,
    FetchProgress,
    HubFetcher,
    find_model,
    list_models,
    remove_model,
)
from llmgw.pki import https_server_ssl_context, peer_common_name

log = structlog.get_logger(__name__)

FetchState = Literal["running", "done", "failed"]
# Fetches remembered for GET /api/v1/fetches; the oldest finished ones are forgotten past this.
_KEEP = 100

_converter = cattrs.Converter()


@attrs.define
class Fetch:
    """A fetch the admin listener started, as GET /api/v1/fetches/{id} shows it."""

    id: str
    model: str
    include: list[str]
    state: FetchState = "running"
    progress: FetchProgress | None = None
    error: str | None = None
    fetched: FetchedModel | None = None


@attrs.frozen
class MirrorModels:
    """Every model on the mirror, with its files, their sizes and pins."""

    models: list[FetchedModel]


@attrs.frozen
class MirrorFetches:
    """The fetches started since the mirror started (the last 100 finished ones), newest first."""

    fetches: list[Fetch]


@attrs.frozen
class MirrorRemoved:
    """A model deleted from the mirror: REPO@COMMIT, and the bytes it held."""

    removed: str
    bytes: int


class Fetches:
    """The fetches started through the admin listener; each a task this owns, cancelled on close."""

    def __init__(self, fetcher: HubFetcher) -> None:
        self._fetcher = fetcher
        self._fetches: dict[str, Fetch] = {}
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._ids = itertools.count(1)

    async def __aenter__(self) -> Fetches:
        return self

    async def __aexit__(self, *exc: object) -> None:
        for task in self._tasks.values():
            task.cancel()
        await asyncio.gather(*self._tasks.values(), return_exceptions=True)

    def start(self, ref: str, include: list[str]) -> Fetch:
        """Start fetching ref; RefError when ref is not a reference."""
        repo, revision = parse_ref(ref)
        fetch = Fetch(id=str(next(self._ids)), model=f"{repo}@{revision}", include=include)
        self._fetches[fetch.id] = fetch
        self._tasks[fetch.id] = asyncio.create_task(self._run(fetch, repo, revision), name=f"fetch {ref}")
        self._forget_old()
        return fetch

    def get(self, fetch_id: str) -> Fetch | None:
        return self._fetches.get(fetch_id)

    def all(self) -> list[Fetch]:
        return sorted(self._fetches.values(), key=lambda f: -int(f.id))

    def running(self, repo: str) -> bool:
        return any(f.state == "running" and f.model.partition("@")[0] == repo for f in self._fetches.values())

    async def _run(self, fetch: Fetch, repo: str, revision: str) -> None:
        def progress(p: FetchProgress) -> None:
            fetch.progress = p

        try:
            fetch.fetched = await self._fetcher.fetch(repo, revision, fetch.include, progress)
            fetch.state = "done"
        except FetchError as exc:
            fetch.state, fetch.error = "failed", str(exc)
            log.warning("a fetch failed", model=fetch.model, error=str(exc))
        except Exception as exc:
            # A fetch must never stay "running" forever on a page: whatever ended it is said.
            fetch.state, fetch.error = "failed", f"{fetch.model}: {exc or type(exc).__name__}"
            log.exception("a fetch failed", model=fetch.model)
        finally:
            self._tasks.pop(fetch.id, None)

    def _forget_old(self) -> None:
        finished = [f for f in self.all() if f.state != "running"]
        for fetch in finished[_KEEP:]:
            self._fetches.pop(fetch.id, None)


def _only_the_control_plane(control_plane: str) -> Middleware:
    @web.middleware
    async def check(request: web.Request, handler: Handler) -> web.StreamResponse:
        # The handshake already required a certificate from the authority; this is who holds it.
        name = peer_common_name(request.transport.get_extra_info("peercert") if request.transport else None)
        if name != control_plane:
            return strictjson.response(
                {
                    "error": f"this listener answers only the control plane (certificate {control_plane!r}), "
                    f"not {name!r}"
                },
                status=403,
            )
        return await handler(request)

    return check


def _error(status: int, message: str) -> web.Response:
    return strictjson.response({"error": message}, status=status)


def make_admin_app(root: Path, fetches: Fetches, control_plane: str) -> web.Application:
    app = web.Application(middlewares=[_only_the_control_plane(control_plane)])

    async def get_models(_: web.Request) -> web.Response:
        models = await asyncio.to_thread(list_models, root)
        return strictjson.response(_converter.unstructure(MirrorModels(models=models)))

    async def post_fetch(request: web.Request) -> web.Response:
        try:
            body = await read_json(request)
        except BadJson as exc:
            return _error(
                exc.status, f'{exc}; expected JSON: {{"model": "org/model@revision", "include": ["*.gguf"]}}'
            )
        if not isinstance(body, dict) or not isinstance(body.get("model"), str):
            return _error(400, 'expected JSON: {"model": "org/model@revision", "include": ["*.gguf"]}')
        include = body.get("include") or []
        if not isinstance(include, list) or not all(isinstance(g, str) and g for g in include):
            return _error(400, "'include' must be a list of globs, such as [\"*.gguf\"]")
        try:
            fetch = fetches.start(body["model"], include)
        except RefError as exc:
            return _error(400, str(exc))
        return strictjson.response(_converter.unstructure(fetch), status=202)

    async def get_fetches(_: web.Request) -> web.Response:
        return strictjson.response(_converter.unstructure(MirrorFetches(fetches=fetches.all())))

    async def get_fetch(request: web.Request) -> web.Response:
        fetch = fetches.get(request.match_info["id"])
        if fetch is None:
            return _error(404, f"no fetch {request.match_info['id']} on this mirror")
        return strictjson.response(_converter.unstructure(fetch))

    async def delete_model(request: web.Request) -> web.Response:
        try:
            repo, revision = parse_ref(request.query.get("model", ""))
        except RefError as exc:
            return _error(400, str(exc))
        if fetches.running(repo):
            return _error(409, f"{repo} is being fetched; delete it once the fetch has finished")
        model = await asyncio.to_thread(find_model, root, repo, revision)
        if model is None:
            return _error(404, f"{repo}@{revision} is not on this mirror")
        await asyncio.to_thread(remove_model, root, model.repo, model.commit)
        log.info("model removed", repo=model.repo, commit=model.commit, bytes=model.size)
        removed = MirrorRemoved(removed=f"{model.repo}@{model.commit}", bytes=model.size)
        return strictjson.response(_converter.unstructure(removed))

    app.router.add_get("/api/v1/models", get_models)
    app.router.add_delete("/api/v1/models", delete_model)
    app.router.add_post("/api/v1/fetches", post_fetch)
    app.router.add_get("/api/v1/fetches", get_fetches)
    app.router.add_get("/api/v1/fetches/{id}", get_fetch)
    return app


@contextlib.asynccontextmanager
async def admin_listener(cfg: MirrorConfig, fetches: Fetches) -> AsyncIterator[str]:
    """Serve the admin API on cfg.admin_listen over mutual TLS; yields its https URL."""
    if not cfg.control_plane:
        raise ConfigError(
            "'control_plane' is not set: the admin listener needs the common name of the control "
            "plane's certificate, the one client it answers"
        )
    host, port = split_host_port(cfg.admin_listen, "admin_listen")
    ssl_context = await asyncio.to_thread(
        https_server_ssl_context, cfg.admin_tls, "the mirror's admin listener"
    )
    runner = web.AppRunner(make_admin_app(Path(cfg.root), fetches, cfg.control_plane), access_log=None)
    await runner.setup()
    try:
        site = web.TCPSite(runner, host, port, ssl_context=ssl_context)
        try:
            await site.start()
        except OSError as exc:
            raise cannot_listen(cfg.admin_listen, "admin_listen", exc) from None
        url = f"https://{host}:{runner.addresses[0][1]}"
        log.info("mirror admin listening", url=url, control_plane=cfg.control_plane)
        yield url
    finally:
        await runner.cleanup()


# The replies of the admin API, for its OpenAPI document (adminapi/openapi.py).
SHAPES: tuple[type, ...] = (MirrorModels, MirrorFetches, MirrorRemoved, Fetch)
