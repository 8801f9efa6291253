"""The client port's pages and, under /admin, the admin listener's pages and API, for administrators.

The one mount of that port besides the gateway's own routes (gateway/app.py):
the account and administration pages (web/app.py), then under /admin the
admin listener's tables (web/admin_listener.py) behind a guard. Pages need an
administrator's session; the API an admin token, or such a session (for a
change, with the session's CSRF token in an X-CSRF-Token header).
"""

from __future__ import annotations

import hmac

from aiohttp import web

from llmgw.adminapi.auth import admin_token_or_session
from llmgw.adminapi.routes import mount
from llmgw.catalog import Catalog
from llmgw.config import ServerConfig
from llmgw.control.inventory import Inventory
from llmgw.control.mirror import MirrorClient
from llmgw.web import admin_listener, cluster
from llmgw.web.app import mount_pages
from llmgw.web.context import WebContext
from llmgw.web.guards import require_admin
from llmgw.web.mirror_page import MIRROR_PAGE
from llmgw.web.pages import mount_table
from llmgw.web.sessions import current_session, current_user

# Where a script in an administrator's browser puts the session's CSRF token to change something.
CSRF_HEADER = "X-CSRF-Token"
ADMIN = "/admin"


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


def mount_client_port(
    app: web.Application,
    cfg: ServerConfig,
    inventory: Inventory,
    catalog: Catalog,
    pages: WebContext,
    mirror: MirrorClient | None = None,
) -> None:
    """Add the pages, and the admin pages and API under /admin, to the gateway's app.

    catalog is the server's live one, the one its gateway routes by: a model added here is served.
    mirror relays /admin/api/v1/mirror/* (`llmgw ctl --server https://HOST/admin mirror`) and has a page;
    None: the relay and the page say there is none, and nothing links to the page.
    """
    mount_pages(app, pages)
    admin_listener.provide(app, cfg, inventory, catalog, pages, mirror, prefix=ADMIN)
    # The mirror page is routed with no mirror too, as on the admin listener: /admin/mirror says there
    # is none, in HTML as the document says (it was the gateway's 404 in JSON); nothing links to it.
    unlinked = (MIRROR_PAGE,) if mirror is None else ()
    mount_table(app, admin_listener.PAGES, prefix=ADMIN, guard=require_admin, unlinked=unlinked)
    mount(app, admin_listener.API, prefix=ADMIN, guard=admin_token_or_session(cfg, _admin_session))
    # The cluster pages' files are at the root on either listener.
    mount_table(app, (cluster.ASSETS,))
