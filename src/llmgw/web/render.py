"""Pages from jinja2 templates, autoescaped: a name full of HTML is shown as text, never run.

Templates are read once, in a thread, when the app starts: a template read
from disk on the first request would block the event loop.
"""

from __future__ import annotations

import asyncio
from importlib import resources
from typing import Any

import jinja2
from aiohttp import web
from markupsafe import Markup

from llmgw.config import AuthConfig
from llmgw.web.context import ACCOUNTS_KEY, ADMIN_LINKS_KEY, WEB_KEY, WebContext
from llmgw.web.sessions import PRE_SESSION_CSRF, current_session, current_user


def _read_package_files() -> tuple[dict[str, str], bytes]:
    root = resources.files("llmgw.web")
    templates = {
        entry.name: entry.read_text(encoding="utf-8")
        for entry in (root / "templates").iterdir()
        if entry.name.endswith(".html")
    }
    return templates, (root / "static" / "llmgw.css").read_bytes()


async def load_templates(ctx: WebContext) -> None:
    """Read the templates and the stylesheet into ctx, once; later calls change nothing."""
    if ctx.templates is not None:
        return
    templates, css = await asyncio.to_thread(_read_package_files)
    ctx.templates = jinja2.Environment(
        loader=jinja2.DictLoader(templates),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    ctx.css = css


def local_accounts(auth: AuthConfig) -> bool:
    """Whether email and password sign-in is offered: unless a provider set up switches it off."""
    oidc, saml = auth.oidc, auth.saml
    return (oidc.local_accounts or not oidc.issuer) and (saml.local_accounts or not saml.idp_metadata)


async def render(request: web.Request, template: str, status: int = 200, **context: Any) -> web.Response:
    """The page template makes with context, plus `user`, `csrf_field()` and the navigation."""
    ctx = request.config_dict[WEB_KEY]
    await load_templates(ctx)
    assert ctx.templates is not None
    user = await current_user(request)
    session = await current_session(request)
    csrf = session.csrf if session is not None else request.get(PRE_SESSION_CSRF, "")

    def csrf_field() -> Markup:
        return Markup('<input type="hidden" name="csrf" value="{}">').format(csrf)

    body = ctx.templates.get_template(template).render(
        user=user,
        csrf_field=csrf_field,
        admin_links=request.config_dict.get(ADMIN_LINKS_KEY, ()),
        signup_open=ctx.cfg.auth.signup_open,
        # The provider's button, and whether the email and password form is still offered.
        oidc_button=ctx.cfg.auth.oidc.button if ctx.cfg.auth.oidc.issuer else "",
        saml_button=ctx.cfg.auth.saml.button if ctx.cfg.auth.saml.idp_metadata else "",
        local_accounts=local_accounts(ctx.cfg.auth),
        accounts=request.config_dict.get(ACCOUNTS_KEY, True),
        path=request.path,
        **context,
    )
    response = web.Response(text=body, status=status, content_type="text/html", charset="utf-8")
    response.headers["Cache-Control"] = "no-store"
    # Nothing here needs framing by another site; refusing it stops clickjacking.
    response.headers["X-Frame-Options"] = "DENY"
    response.headers["Content-Security-Policy"] = "default-src 'self'; frame-ancestors 'none'"
    return response
