"""The mirror role: model files served over HTTP on the local network.

aiohttp's file responses answer Range requests, which is what lets a node
resume an interrupted download of a multi-gigabyte file instead of starting over.
A directory's URL (ending in "/") answers with the listing a node fetches a
whole directory by: {"files": [{"path": "config.json", "size": 1234}, ...]}
(agent/weights.py). Asked for HTML (pip sends `Accept: text/html`), the same
URL answers with a page of links to the files instead, which is what pip's
`--find-links URL` reads: a node installs vLLM from the wheels a bundle
placed under files/engines/wheels/ (bundle/wheelhouse.py) with no index.

No name beginning with a dot is listed or served: the mirror keeps its own
bookkeeping under such names (downloads in progress under .incoming/, a
model's pins in .llmgw-model.json, mirror/fetch.py), and a node that fetched a
half-downloaded file would have to throw it away.
"""

from __future__ import annotations

import asyncio
import contextlib
import html
import urllib.parse
from collections.abc import AsyncIterator
from pathlib import Path

import attrs
import structlog
from aiohttp import hdrs, web
from aiohttp.typedefs import Handler

from llmgw import strictjson
from llmgw.config import MirrorConfig
from llmgw.listen import cannot_listen, split_host_port
from llmgw.mirror.admin import Fetches, admin_listener
from llmgw.mirror.fetch import HubFetcher, read_token

log = structlog.get_logger(__name__)


@attrs.frozen
class MirrorHandle:
    url: str
    # The admin listener's https URL; None when admin_listen is empty.
    admin_url: str | None = None


def list_files(root: Path, directory: Path) -> list[dict[str, object]] | None:
    """Every regular file under directory, relative to it; None when it is not a directory inside root.

    Blocking (it walks the tree): call it in a thread. Symbolic links are left out, as the
    file route does not follow them either: a listing must not name a file a node cannot fetch.
    """
    base = root.resolve()
    try:
        target = directory.resolve()
        target.relative_to(base)
    except (OSError, ValueError):
        return None
    if not target.is_dir() or directory.is_symlink():
        return None
    files = []
    if _hidden(target.relative_to(base).as_posix()):
        return None
    for path in sorted(target.rglob("*")):
        if path.is_symlink() or not path.is_file() or any(p.is_symlink() for p in path.parents if p != base):
            continue
        if _hidden(path.relative_to(target).as_posix()):
            continue
        files.append({"path": path.relative_to(target).as_posix(), "size": path.stat().st_size})
    return files


def links_page(files: list[dict[str, object]]) -> str:
    """A directory's files as an HTML page of relative links, the form pip's --find-links reads."""
    rows = "".join(
        f'<a href="{html.escape(urllib.parse.quote(str(f["path"])))}">{html.escape(str(f["path"]))}</a><br>\n'
        for f in files
    )
    return f"<!DOCTYPE html>\n<html><body>\n{rows}</body></html>\n"


def _hidden(path: str) -> bool:
    return any(part.startswith(".") and part != "." for part in path.split("/"))


@web.middleware
async def _no_hidden_names(request: web.Request, handler: Handler) -> web.StreamResponse:
    if request.path.startswith("/files/") and _hidden(request.path.removeprefix("/files/")):
        raise web.HTTPNotFound(text="no such file on this mirror")
    return await handler(request)


def make_mirror_app(root: Path) -> web.Application:
    app = web.Application(middlewares=[_no_hidden_names])

    async def listing(request: web.Request) -> web.Response:
        files = await asyncio.to_thread(list_files, root, root / request.match_info["path"])
        if files is None:
            raise web.HTTPNotFound(text="no such directory on this mirror")
        # llmgw's own clients send aiohttp's `Accept: */*` and read JSON; pip and browsers name text/html.
        if "text/html" in request.headers.get(hdrs.ACCEPT, ""):
            return web.Response(text=links_page(files), content_type="text/html")
        return strictjson.response({"files": files})

    # Before the static route, which would otherwise answer a directory's URL with 403.
    app.router.add_get("/files/{path:(.*/)?}", listing)
    app.router.add_static("/files/", root, show_index=False, follow_symlinks=False)

    async def health(_: web.Request) -> web.Response:
        return strictjson.response({"status": "ok"})

    app.router.add_get("/health", health)
    return app


@contextlib.asynccontextmanager
async def mirror_role(cfg: MirrorConfig) -> AsyncIterator[MirrorHandle]:
    host, port = split_host_port(cfg.listen, "listen")
    root = Path(cfg.root)
    async with contextlib.AsyncExitStack() as stack:
        # In a thread: add_static resolves the root on the disk.
        runner = web.AppRunner(await asyncio.to_thread(make_mirror_app, root), access_log=None)
        await runner.setup()
        stack.push_async_callback(runner.cleanup)
        site = web.TCPSite(runner, host, port)
        try:
            await site.start()
        except OSError as exc:
            raise cannot_listen(cfg.listen, "listen", exc) from None
        bound = runner.addresses[0][1]
        url = f"http://{host}:{bound}"
        log.info("mirror serving", url=url, root=cfg.root)
        admin_url = None
        if cfg.admin_listen:
            token = await asyncio.to_thread(read_token, cfg.hf_token_file)
            fetcher = await stack.enter_async_context(HubFetcher(root, cfg.hf_endpoint, token))
            fetches = await stack.enter_async_context(Fetches(fetcher))
            admin_url = await stack.enter_async_context(admin_listener(cfg, fetches))
        yield MirrorHandle(url=url, admin_url=admin_url)
