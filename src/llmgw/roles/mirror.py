"""The mirror role: model files served over HTTP on the local network.

aiohttp's file responses answer Range requests, which is what lets a node
resume an interrupted download of a multi-gigabyte file instead of starting over.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import attrs
import structlog
from aiohttp import web

from llmgw.config import MirrorConfig
from llmgw.roles.listen import split_host_port

log = structlog.get_logger(__name__)


@attrs.frozen
class MirrorHandle:
    url: str


def make_mirror_app(root: Path) -> web.Application:
    app = web.Application()
    app.router.add_static("/files/", root, show_index=False, follow_symlinks=False)

    async def health(_: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    app.router.add_get("/health", health)
    return app


@contextlib.asynccontextmanager
async def mirror_role(cfg: MirrorConfig) -> AsyncIterator[MirrorHandle]:
    host, port = split_host_port(cfg.listen, "listen")
    runner = web.AppRunner(make_mirror_app(Path(cfg.root)), access_log=None)
    await runner.setup()
    try:
        site = web.TCPSite(runner, host, port)
        await site.start()
        bound = runner.addresses[0][1]
        url = f"http://{host}:{bound}"
        log.info("mirror serving", url=url, root=cfg.root)
        yield MirrorHandle(url=url)
    finally:
        await runner.cleanup()
