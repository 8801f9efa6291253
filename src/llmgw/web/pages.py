"""A table of pages (adminapi/routes.py's Route) mounted on an app, with their entries in the navigation.

A page is its module, its template and one Route in its module's table: the listener that
serves the table (web/admin_listener.py, web/client_port.py) mounts it here, and a page
with a link appears in the administrators' navigation of exactly the apps that serve it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from aiohttp import web

from llmgw.adminapi.routes import Guard, Route, mount
from llmgw.web.context import AdminLink, add_admin_links


def mount_table(
    app: web.Application,
    pages: Iterable[Route],
    *,
    prefix: str = "",
    guard: Guard | None = None,
    unlinked: Sequence[Route] = (),
) -> None:
    """Add pages under prefix to app, each behind guard, and their links (not unlinked's) to the nav."""
    pages = tuple(pages)
    # A page answers HEAD as well as GET, as aiohttp's add_get does.
    mount(app, pages, prefix=prefix, guard=guard, head=True)
    add_admin_links(app, *(AdminLink(p.at(prefix), p.link) for p in pages if p.link and p not in unlinked))
