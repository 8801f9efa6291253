"""The server's own file listener: the catalog's local sources served to nodes as the mirror serves files.

A model whose `source` is a file or directory on this machine (llmgw/localsource.py)
is sent to nodes as a URL here: `/weights/KEY/NAME` for a file, `/weights/KEY/`
for a directory, which answers with the listing agent/weights.py fetches a
directory by ({"files": [{"path": ..., "size": ...}]}). Only the files a catalog
model pinned are served, nothing else on the disk; a request for anything else
is 404, and a file changed since it was pinned is served as it is now and
refused by the node, whose check against the pin is what holds.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
from collections.abc import AsyncIterator
from pathlib import Path

import structlog
from aiohttp import web

from llmgw import localsource, strictjson
from llmgw.catalog import Catalog
from llmgw.config import ModelConfig, ServerConfig
from llmgw.control.ha.leadership import advertised
from llmgw.listen import cannot_listen, split_host_port
from llmgw.names import shard_stem

log = structlog.get_logger(__name__)

PREFIX = "/weights"


def key_of(model: ModelConfig) -> str:
    """The model's directory in the URL: readable, and another for another path."""
    return f"{shard_stem(model.name)}-{hashlib.sha256(model.source.encode()).hexdigest()[:12]}"


class LocalFiles:
    """Where nodes fetch each local source from: the listener's URL, as nodes reach it."""

    def __init__(self, base_url: str) -> None:
        self.base_url = base_url.rstrip("/")

    def url(self, model: ModelConfig) -> str:
        """The URL nodes are sent for model's local source: its file's, or its directory's ending in '/'."""
        path = localsource.local_path(model.source)
        assert path is not None, "url is asked only for a local source"
        base = f"{self.base_url}{PREFIX}/{key_of(model)}/"
        # A file source is pinned by its own name alone; a directory's names are paths under it.
        if list(model.sha256) == [path.name] and not model.source.endswith("/"):
            return base + path.name
        return base


def files_app(catalog: Catalog) -> web.Application:
    """The files of the catalog's local sources, by key_of(model): a directory's listing, or a pinned file."""

    def served(key: str) -> tuple[Path, dict[str, str]] | None:
        for model in catalog.models():
            path = localsource.local_path(model.source)
            if path is not None and key_of(model) == key:
                return path, dict(model.sha256)
        return None

    async def listing(request: web.Request) -> web.Response:
        found = served(request.match_info["key"])
        if found is None:
            raise web.HTTPNotFound(text="no model in the catalog has its weights here")
        path, pins = found
        files = await asyncio.to_thread(_sizes, path, pins)
        return strictjson.response({"files": files})

    async def file(request: web.Request) -> web.StreamResponse:
        found = served(request.match_info["key"])
        name = request.match_info["name"]
        if found is None or name not in found[1]:
            raise web.HTTPNotFound(text="no model in the catalog pins that file")
        on_disk = await asyncio.to_thread(_file_of, found[0], name)
        if on_disk is None:
            raise web.HTTPNotFound(text=f"{name} is no longer on the server's disk")
        # aiohttp's file response answers Range requests: a node resumes a cut-off download.
        return web.FileResponse(on_disk)

    app = web.Application()
    app.router.add_get(PREFIX + "/{key}/", listing)
    app.router.add_get(PREFIX + "/{key}/{name:.+}", file)
    return app


def _file_of(path: Path, name: str) -> Path | None:
    """The file name names under a local source at path (the source itself for a file); None when gone."""
    file = path if path.is_file() else path / name
    return file if file.is_file() and not file.is_symlink() else None


def _sizes(path: Path, pins: dict[str, str]) -> list[dict[str, object]]:
    out: list[dict[str, object]] = []
    for name in pins:
        file = _file_of(path, name)
        out.append({"path": name, "size": file.stat().st_size} if file is not None else {"path": name})
    return out


@contextlib.asynccontextmanager
async def serve_local_files(cfg: ServerConfig, catalog: Catalog) -> AsyncIterator[LocalFiles]:
    """The listener on `weights_listen` until exit; when empty, agent_listen's host on the port it
    had last time (kept in state_dir), else a free one."""
    runner = web.AppRunner(files_app(catalog), access_log=None)
    await runner.setup()
    try:
        host, port = await _listen(runner, cfg)
        # Nodes reach this machine where they reach its agent service.
        named = (
            split_host_port(cfg.control.advertise, "control.advertise")[0] if cfg.control.advertise else ""
        )
        files = LocalFiles(f"http://{advertised(f'{named}:{port}' if named else '', host, port)}")
        log.info("serving local model files to nodes", url=files.base_url)
        yield files
    finally:
        await runner.cleanup()


async def _listen(runner: web.AppRunner, cfg: ServerConfig) -> tuple[str, int]:
    """(host, port) bound. A node keeps weights by their URL: a port that moved at every restart
    would have every node fetch every local model again, so the free port taken once is kept."""
    if cfg.weights_listen:
        host, port = split_host_port(cfg.weights_listen, "weights_listen")
        try:
            await web.TCPSite(runner, host or None, port).start()
        except OSError as exc:
            raise cannot_listen(cfg.weights_listen, "weights_listen", exc) from None
        return host, runner.addresses[-1][1]
    host, _ = split_host_port(cfg.agent_listen, "agent_listen")
    kept = Path(cfg.state_dir) / _PORT_FILE
    last = await asyncio.to_thread(_read_port, kept)
    for port in ([last] if last else []) + [0]:
        site = web.TCPSite(runner, host or None, port)
        try:
            await site.start()
        except OSError as exc:
            await site.stop()
            if port == 0:
                raise cannot_listen(f"{host}:0", "weights_listen", exc) from None
            log.info("the port local model files were served on is taken; taking another", port=port)
            continue
        break
    bound = int(runner.addresses[-1][1])
    if bound != last:
        await asyncio.to_thread(_write_port, kept, bound)
    return host, bound


# Where the port chosen for an empty weights_listen is kept, in state_dir.
_PORT_FILE = "weights-listen.port"


def _read_port(path: Path) -> int:
    try:
        return int(path.read_text(encoding="utf-8").strip())
    except (OSError, ValueError):
        return 0


def _write_port(path: Path, port: int) -> None:
    try:
        path.write_text(f"{port}\n", encoding="utf-8")
    except OSError as exc:
        log.warning("cannot keep the port local model files are served on", path=str(path), error=str(exc))
