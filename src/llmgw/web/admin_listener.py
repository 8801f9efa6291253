"""The admin listener: the cluster pages and the admin API, for the control plane's own machine.

Nothing here asks who you are: reaching the loopback address is the
credential, as it is for `llmgw ctl` run on the server. Two things keep a
browser on that machine from being used against it: requests must name the
machine itself in their Host header (a page elsewhere cannot rebind its own
name to 127.0.0.1 and read the cluster), and changes are JSON only (which a
page elsewhere cannot send without a preflight this listener never answers).
"""

from __future__ import annotations

import hmac
from collections.abc import Callable

from aiohttp import web
from aiohttp.typedefs import Handler

from llmgw.adminapi import tenancy as tenancyapi
from llmgw.adminapi.handlers import admin_token_or_session
from llmgw.bodies import decode_bodies
from llmgw.catalog import Catalog
from llmgw.config import ServerConfig
from llmgw.control import mirror as mirrorapi
from llmgw.control.inventory import Inventory
from llmgw.control.mirror import MirrorClient
from llmgw.listen import split_host_port
from llmgw.web.cluster import mount_cluster_pages
from llmgw.web.context import ACCOUNTS_KEY, WEB_KEY, WebContext
from llmgw.web.guards import require_admin
from llmgw.web.mirror_page import mirror_page
from llmgw.web.render import load_templates
from llmgw.web.sessions import current_session, current_user

_LOCAL_NAMES = frozenset({"127.0.0.1", "localhost", "::1"})
# A model's definition may come as YAML (`llmgw ctl model add`); YAML's types, like JSON's, are not
# ones a page elsewhere may send without a preflight.
_CHANGE_TYPES = frozenset({"application/json", "application/yaml", "application/x-yaml", "text/yaml"})


# aiohttp's default: a model's definition or a node's new state is a few kilobytes.
_MAX_BODY = 1024**2

# Where a script in an administrator's browser puts the session's CSRF token to change something.
CSRF_HEADER = "X-CSRF-Token"


def _host_name(host: str) -> str:
    """ "127.0.0.1" from "127.0.0.1:9090", "::1" from "[::1]:9090"."""
    if host.startswith("["):
        return host[1:].partition("]")[0]
    return host.rpartition(":")[0] if host.count(":") == 1 else host


def _api_error(request: web.Request, status: int, message: str) -> web.StreamResponse:
    return web.json_response({"error": message}, status=status)


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
        response = web.json_response({"error": message}, status=exc.status)
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
    """The app admin_listen serves: /, /models, /nodes/{id}/logs and /api/v1/*.

    catalog is the server's live one, the one its gateway routes by: a model added here is served.
    mirror relays /api/v1/mirror/* (`llmgw ctl mirror`); None: those routes answer that there is none.
    """
    listen_host, _ = split_host_port(cfg.admin_listen, "admin_listen")
    allowed = _LOCAL_NAMES | {listen_host}

    @web.middleware
    async def this_machine_only(request: web.Request, handler: Handler) -> web.StreamResponse:
        if _host_name(request.host.lower()) not in allowed:
            return web.json_response(
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
            return web.json_response(
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
            web.normalize_path_middleware(append_slash=False, remove_slash=True),
            decode_bodies(_api_error, _MAX_BODY),
        ]
    )
    app[WEB_KEY] = pages
    app[ACCOUNTS_KEY] = False

    async def load(app: web.Application) -> None:
        await load_templates(pages)

    app.on_startup.append(load)
    mount_cluster_pages(app, cfg, inventory, catalog, on_admin_listener=True)
    tenancyapi.install(app, pages.store, pages.spent)
    mirrorapi.install(app, mirror)
    if mirror is None:
        # Still routed, so that /mirror says there is no mirror, as the document says (with a mirror,
        # the server mounts the page and its link).
        app.router.add_get("/mirror", mirror_page)

    async def css(request: web.Request) -> web.StreamResponse:
        return web.Response(
            body=pages.css, content_type="text/css", headers={"Cache-Control": "max-age=3600"}
        )

    app.router.add_get("/static/llmgw.css", css)
    return app


async def _admin_session(request: web.Request) -> bool:
    user = await current_user(request)
    if user is None or not user.is_admin or not user.active:
        return False
    if request.method in ("GET", "HEAD"):
        return True
    # A change needs the session's CSRF token in a header: the cookie alone rides along with any
    # request a page elsewhere makes, the token is only on this site's own pages.
    session = await current_session(request)
    sent = request.headers.get(CSRF_HEADER, "")
    return session is not None and bool(sent) and hmac.compare_digest(sent, session.csrf)


def client_port_api_guard(cfg: ServerConfig) -> Callable[[Handler], Handler]:
    """The guard of the admin API under /admin on the client port, for routes mounted beside it."""
    return admin_token_or_session(cfg, _admin_session)


def mount_on_client_port(
    app: web.Application, cfg: ServerConfig, inventory: Inventory, catalog: Catalog
) -> None:
    """The same pages and API under /admin on the client port, for administrators only; after mount_pages.

    Pages need an administrator's session; the API an admin token, or such a session (for a change,
    with the session's CSRF token in an X-CSRF-Token header).
    """
    guard_api = admin_token_or_session(cfg, _admin_session)
    mount_cluster_pages(
        app,
        cfg,
        inventory,
        catalog,
        on_admin_listener=False,
        guard_page=require_admin,
        guard_api=guard_api,
    )
    # After mount_pages, whose context holds the store.
    pages = app[WEB_KEY]
    tenancyapi.install(app, pages.store, pages.spent, prefix="/admin", guard=guard_api)
