"""The mirror page (/mirror on the admin listener, /admin/mirror on the client port).

Where server.yaml names no mirror, the admin listener's /mirror is a 404 saying
so. It shows what the mirror holds and what it is fetching, asked of the mirror
at each view; a mirror that cannot be reached is said so on the page rather than
failing it.
"""

from __future__ import annotations

from aiohttp import web

from llmgw.adminapi.routes import Reply, Route
from llmgw.control.mirror import MIRROR_CLIENT_KEY, MirrorError
from llmgw.download import human_bytes
from llmgw.mirror.admin import Fetch
from llmgw.mirror.fetch import FetchedModel
from llmgw.web.cluster import PATHS_KEY
from llmgw.web.render import render


async def mirror_page(request: web.Request) -> web.StreamResponse:
    client = request.config_dict[MIRROR_CLIENT_KEY]
    if client is None:
        # Routed either way, so that the path answers what the admin API's document says of it.
        return web.Response(
            status=404,
            content_type="text/html",
            text="<p>No mirror is configured: set <code>mirror.api</code> in server.yaml.</p>",
        )
    models: list[FetchedModel] = []
    fetches: list[Fetch] = []
    error = None
    try:
        models = await client.models()
        fetches = await client.fetches()
    except MirrorError as exc:
        error = str(exc)
    return await render(
        request,
        "admin_mirror.html",
        status=200 if error is None else 502,
        paths=request.config_dict[PATHS_KEY],
        api=client.api,
        models=models,
        fetches=fetches,
        error=error,
        human_bytes=human_bytes,
    )


MIRROR_PAGE = Route(
    method="GET",
    path="/mirror",
    handler=mirror_page,
    operation="mirrorPage",
    summary="The models on the mirror and its fetches (where a mirror is configured).",
    replies={
        200: Reply("HTML.", html=True),
        404: Reply("No mirror is configured (server.yaml's `mirror.api`).", html=True),
        502: Reply("The mirror cannot be reached: the page says so.", html=True),
    },
    link="Mirror",
)
