"""The account and administration pages of the client port, as tables of routes.

Plain routes on the gateway's app, with no middleware: a session is looked
up only by the page handlers that need one (require_login, require_admin),
so /v1/* pays nothing for the pages. The client port mounts these with the
rest of its tables (web/client_port.py).
"""

from __future__ import annotations

import asyncio

from aiohttp import web

from llmgw.adminapi.routes import Handler, Param, Route
from llmgw.names import ID_PATTERN
from llmgw.web import account, admin, oidc_pages, projects, saml_pages
from llmgw.web.context import WEB_KEY, WebContext
from llmgw.web.oidc import Provider, read_secret
from llmgw.web.pages import mount_table
from llmgw.web.render import load_templates
from llmgw.web.saml import ServiceProvider


async def _css(request: web.Request) -> web.StreamResponse:
    ctx = request.config_dict[WEB_KEY]
    await load_templates(ctx)
    return web.Response(
        body=ctx.css, content_type="text/css", charset="utf-8", headers={"Cache-Control": "max-age=3600"}
    )


def _page(
    method: str,
    path: str,
    handler: Handler,
    summary: str,
    *,
    parameters: tuple[Param, ...] = (),
    link: str = "",
) -> Route:
    """A page of the client port alone, which the admin API's document does not list."""
    return Route(method=method, path=path, handler=handler, summary=summary, parameters=parameters, link=link)


# Every page's stylesheet, on either listener.
STYLESHEET = _page("GET", "/static/llmgw.css", _css, "The pages' stylesheet.")

# What any app with accounts needs to sign in; not the admin listener's (reaching it is the credential).
SIGN_IN: tuple[Route, ...] = (
    _page("GET", "/login", account.login_page, "The sign-in form."),
    _page("POST", "/login", account.login, "Sign in."),
    _page("POST", "/logout", account.logout, "Sign out."),
    _page("GET", "/login/oidc", oidc_pages.start, "Sign in through the identity provider."),
    _page(
        "GET", "/login/oidc/callback", oidc_pages.callback, "Where the identity provider sends people back."
    ),
    _page("GET", "/login/saml", saml_pages.start, "Sign in through the SAML identity provider."),
    _page("POST", "/login/saml/acs", saml_pages.acs, "Where the SAML identity provider posts its answer."),
    _page("GET", "/login/saml/metadata", saml_pages.metadata, "This server's SAML metadata."),
    STYLESHEET,
)

ACCOUNT_PAGES: tuple[Route, ...] = (
    _page("GET", "/", account.root, "The profile when signed in, else the sign-in form."),
    _page("GET", "/signup", account.signup_page, "The sign-up form."),
    _page("POST", "/signup", account.signup, "Ask for an account."),
    _page("GET", "/profile", account.profile, "Your account, keys and usage."),
    _page("POST", "/profile/password", account.change_password, "Change your password."),
    _page("POST", "/profile/keys", account.create_own_key, "Make yourself a key."),
    _page(
        "POST",
        "/profile/keys/{key_id}/revoke",
        account.revoke_own_key,
        "Revoke one of your keys.",
        parameters=(Param("key_id", pattern=ID_PATTERN),),
    ),
)

ADMIN_PAGES: tuple[Route, ...] = (
    _page("GET", "/admin", admin.admin_root, "The administrators' first page."),
    _page("GET", "/admin/users", admin.users_page, "Every account.", link="Users"),
    _page(
        "POST",
        "/admin/users/{user_id}/{action}",
        admin.user_action,
        "Approve, promote or disable an account.",
        parameters=(Param("user_id", pattern=ID_PATTERN), Param("action", pattern="approve|promote|disable")),
    ),
    _page(
        "GET", "/admin/projects", projects.projects_page, "Organisations, teams, projects.", link="Projects"
    ),
    _page(
        "POST",
        "/admin/projects/{action}",
        projects.projects_action,
        "Change an organisation, team or project.",
        parameters=(Param("action", pattern="create|rename|delete|member-add|member-remove|models"),),
    ),
    _page("GET", "/admin/quotas", admin.quotas_page, "Limits and budgets.", link="Quotas"),
    _page("POST", "/admin/quotas", admin.save_quota, "Change a scope's limits and budget."),
    _page("GET", "/admin/usage", admin.usage_page, "What was used.", link="Usage"),
    _page("GET", "/admin/usage.csv", admin.usage_csv, "What was used, as CSV."),
)


def provide(app: web.Application, ctx: WebContext) -> None:
    """Put ctx in app, and have the templates read when it starts."""
    app[WEB_KEY] = ctx

    async def load(app: web.Application) -> None:
        await load_templates(ctx)
        oidc = ctx.cfg.auth.oidc
        if oidc.issuer and ctx.oidc is None:
            # Read here, in a thread, and kept only in memory: server.yaml names where it is.
            ctx.oidc = Provider(oidc, await asyncio.to_thread(read_secret, oidc))
        if ctx.cfg.auth.saml.idp_metadata and ctx.saml is None:
            ctx.saml = await ServiceProvider.load(ctx.cfg.auth.saml)

    app.on_startup.append(load)


def mount_sign_in(app: web.Application, ctx: WebContext) -> None:
    """What any app with accounts' pages needs: ctx, /login, /logout and the stylesheet.

    Not the admin listener's: it has no accounts (reaching it is the credential), and its
    pages offer no "Log in" (ACCOUNTS_KEY).
    """
    provide(app, ctx)
    mount_table(app, SIGN_IN)


def mount_pages(app: web.Application, ctx: WebContext) -> None:
    """Add /, /login, /logout, /signup, /profile, /admin/* and /static/llmgw.css to app."""
    mount_sign_in(app, ctx)
    mount_table(app, (*ACCOUNT_PAGES, *ADMIN_PAGES))
