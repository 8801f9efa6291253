"""The admin listener: the cluster pages and the admin API, for the control plane's own machine.

The one mount of that listener (make_admin_app), from the tables: PAGES, API and the
files the pages load. The admin API's document is made from the same tables.

Nothing here asks who you are: reaching the loopback address is the
credential, as it is for `llmgw ctl` run on the server. Two things keep a
browser on that machine from being used against it: requests must name the
machine itself in their Host header (a page elsewhere cannot rebind its own
name to 127.0.0.1 and read the cluster), and changes are JSON only (which a
page elsewhere cannot send without a preflight this listener never answers).
"""

from __future__ import annotations

import ipaddress
from typing import Any

from aiohttp import web
from aiohttp.typedefs import Handler

import llmgw
from llmgw import bound, strictjson
from llmgw.adminapi import bench as benchapi
from llmgw.adminapi import capacity as capacityapi
from llmgw.adminapi import handlers as adminapi
from llmgw.adminapi import mirror as mirrorapi
from llmgw.adminapi import openapi
from llmgw.adminapi import tenancy as tenancyapi
from llmgw.adminapi import upgrades as upgradesapi
from llmgw.adminapi.openapi import DOCUMENT_KEY
from llmgw.adminapi.routes import Route, mount
from llmgw.bodies import MAX_ADMIN_BODY, decode_bodies
from llmgw.catalog import Catalog
from llmgw.config import ServerConfig
from llmgw.control.inventory import Inventory
from llmgw.control.mirror import MirrorClient
from llmgw.listen import split_host_port
from llmgw.slashes import plain_paths
from llmgw.web import app as pages_app
from llmgw.web import cluster
from llmgw.web.context import ACCOUNTS_KEY, WebContext
from llmgw.web.mirror_page import MIRROR_PAGE
from llmgw.web.pages import mount_table

# The admin API, on the admin listener and under /admin on the client port.
API: tuple[Route, ...] = (
    *adminapi.ROUTES,
    *capacityapi.ROUTES,
    *benchapi.ROUTES,
    *tenancyapi.ROUTES,
    *mirrorapi.ROUTES,
    *upgradesapi.ROUTES,
)
# The pages of the admin listener, at its root; under /admin on the client port too.
PAGES: tuple[Route, ...] = (*cluster.PAGES, MIRROR_PAGE)
# Files the pages load; not in the document.
FILES: tuple[Route, ...] = (cluster.ASSETS, pages_app.STYLESHEET)

_LOCAL_NAMES = frozenset({"127.0.0.1", "localhost", "::1"})
# A model's definition may come as YAML (`llmgw ctl model add`); YAML's types, like JSON's, are not
# ones a page elsewhere may send without a preflight.
_CHANGE_TYPES = frozenset({"application/json", "application/yaml", "application/x-yaml", "text/yaml"})


# aiohttp's default: a model's definition or a node's new state is a few kilobytes.
_MAX_BODY = MAX_ADMIN_BODY


def exposure(host: str, port: int) -> str | None:
    """What to warn of when the listener is bound to host (an IP address), reachable from other
    machines; None on loopback.

    Nothing here asks who you are, and the Host check stops only a browser's page on another site:
    curl from another machine names `localhost` as easily. On 0.0.0.0, whoever reaches the port
    can do everything the admin API does.
    """
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    if address.is_loopback:
        return None
    return (
        f"the admin listener is on {bound.address(host, port)}, which other machines can reach, and it asks "
        "no one to sign in: whoever reaches it can do everything the admin API does. Keep admin_listen on "
        "127.0.0.1 and use /admin on the client port from elsewhere (docs/accounts.md, Pages)"
    )


def _host_name(host: str) -> str:
    """ "127.0.0.1" from "127.0.0.1:9090", "::1" from "[::1]:9090"."""
    if host.startswith("["):
        return host[1:].partition("]")[0]
    return host.rpartition(":")[0] if host.count(":") == 1 else host


def unreadable(status: int, message: str) -> web.Response:
    """The admin API's shape ({"error": "..."}) for what aiohttp could not read (llmgw.httpserver).

    On the pages' paths too: the request line or a header is what could not be read, so neither its
    route nor whether a browser asked is known.
    """
    return strictjson.response({"error": message}, status=status)


def _api_error(request: web.Request, status: int, message: str) -> web.StreamResponse:
    return unreadable(status, message)


@web.middleware
async def _api_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """aiohttp's own refusals (no such path, wrong method, body too large) in the admin API's shape."""
    try:
        return await handler(request)
    except web.HTTPException as exc:
        if exc.status < 400 or not request.path.startswith("/api/"):
            raise
        message = {
            404: f"there is no {request.path} in the admin API; /api/v1/openapi.json lists its paths",
            405: f"{request.path} does not accept {request.method}",
        }.get(exc.status, exc.text or exc.reason)
        response = strictjson.response({"error": message}, status=exc.status)
        if "Allow" in exc.headers:
            response.headers["Allow"] = exc.headers["Allow"]
        return response


def make_admin_app(
    cfg: ServerConfig,
    inventory: Inventory,
    catalog: Catalog,
    pages: WebContext,
    mirror: MirrorClient | None = None,
) -> web.Application:
    """The app admin_listen serves, from the tables: its pages (PAGES), the admin API and mirror relay (API).

    catalog is the server's live one, the one its gateway routes by: a model added here is served.
    mirror relays /api/v1/mirror/* (`llmgw ctl mirror`); None: those routes answer that there is none.
    """
    listen_host, _ = split_host_port(cfg.admin_listen, "admin_listen")
    allowed = _LOCAL_NAMES | {listen_host}

    @web.middleware
    async def this_machine_only(request: web.Request, handler: Handler) -> web.StreamResponse:
        if _host_name(request.host.lower()) not in allowed:
            return strictjson.response(
                {
                    "error": "the admin listener answers only to this machine's own names, "
                    f"not {request.host}; "
                    "from elsewhere, use /admin on the client port with an admin token or session"
                },
                status=421,
            )
        # POST only: it is the one change a page elsewhere may send without a preflight (a form, or
        # a fetch with no body); DELETE and the rest are preflighted. A path or method no route
        # takes is a 404 or 405, not a 415.
        if (
            request.method == "POST"
            and request.match_info.http_exception is None
            and request.content_type not in _CHANGE_TYPES
        ):
            return strictjson.response(
                {
                    "error": "changes are accepted as JSON only (Content-Type: application/json), "
                    "and a model's definition as YAML (Content-Type: application/yaml)"
                },
                status=415,
            )
        return await handler(request)

    app = web.Application(
        middlewares=[
            _api_errors,
            this_machine_only,
            # /models/ leads where /models does; before the body is read, which keeps it from redirecting.
            plain_paths,
            decode_bodies(_api_error, _MAX_BODY),
        ]
    )
    app[ACCOUNTS_KEY] = False
    pages_app.provide(app, pages)
    provide(app, cfg, inventory, catalog, pages, mirror, prefix="")
    # The mirror page is routed with no mirror too, so that /mirror says there is none, as the
    # document says; it is linked only where there is one.
    mount_table(app, PAGES, unlinked=(MIRROR_PAGE,) if mirror is None else ())
    mount(app, API)
    mount_table(app, FILES)
    return app


def provide(
    app: web.Application,
    cfg: ServerConfig,
    inventory: Inventory,
    catalog: Catalog,
    pages: WebContext,
    mirror: MirrorClient | None,
    *,
    prefix: str,
) -> None:
    """Put in app what the admin API and its pages under prefix read, and the document of them."""
    adminapi.provide(app, cfg, inventory, catalog)
    tenancyapi.provide(app, pages.store, pages.spent)
    mirrorapi.provide(app, mirror)
    cluster.provide(app, prefix)
    app[DOCUMENT_KEY] = document(llmgw.__version__)


def document(version: str) -> dict[str, Any]:
    """The admin API's OpenAPI document: the admin listener's pages and API, the same on the client port."""
    return openapi.document(version, (*PAGES, *API))
