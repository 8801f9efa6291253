"""What the pages need from the server, in one object the aiohttp apps hold under WEB_KEY."""

from __future__ import annotations

from collections.abc import Callable

import attrs
import jinja2
from aiohttp import web

from llmgw.config import ServerConfig
from llmgw.store import Store
from llmgw.store.scopes import Scope
from llmgw.web.logins import LoginThrottle
from llmgw.web.oidc import Provider
from llmgw.web.saml import ServiceProvider


@attrs.define
class WebContext:
    cfg: ServerConfig
    store: Store
    # What a running gateway counts as spent of a scope's budget this period;
    # None where the pages run without a gateway (tests of the pages alone).
    spent: Callable[[Scope], float | None] | None = None
    # Loaded in a thread when the app starts (reading templates would block the loop).
    templates: jinja2.Environment | None = None
    css: bytes = b""
    # Failed sign-ins per email and per address; tests give it a clock they move by hand.
    logins: LoginThrottle = attrs.field(factory=LoginThrottle)
    # The identity provider auth.oidc names, set up when the app starts (its secret is read then).
    oidc: Provider | None = None
    # This server as auth.saml's provider knows it, set up when the app starts (its metadata read then).
    saml: ServiceProvider | None = None


WEB_KEY = web.AppKey("llmgw.web", WebContext)
# False on an app with no accounts (the admin listener: reaching it is the credential), whose
# pages must not offer a "Log in" or a profile that is not there.
ACCOUNTS_KEY = web.AppKey("llmgw.web.accounts", bool)


@attrs.frozen
class AdminLink:
    """An entry of the administrators' navigation on every page."""

    href: str
    label: str


# The navigation an app's pages show an administrator, in the order the pages were mounted.
ADMIN_LINKS_KEY = web.AppKey("llmgw.web.admin_links", tuple[AdminLink, ...])


def add_admin_links(app: web.Application, *links: AdminLink) -> None:
    """Put links in app's administrators' navigation, after those already there.

    Called by whatever mounts the pages, so the navigation lists exactly the pages this
    app serves: a list filled in as modules were imported showed the cluster pages on
    an app that never mounted them, depending on what happened to be imported first.
    """
    app[ADMIN_LINKS_KEY] = (*app.get(ADMIN_LINKS_KEY, ()), *links)
