"""Who is signed in to the pages: the session cookie and the CSRF tokens.

Only page handlers call these (through guards.py, mostly); /v1/* never looks a session up, so the API
path pays nothing for the pages.

The cookies are HttpOnly (no script reads them) and SameSite=Lax (another
site's form cannot post with them); Secure when the request came over HTTPS,
directly or through a proxy that says so. Every form also carries a CSRF
token: the session's own once signed in, and before that (login, signup) one
that must match a cookie of its own (the double-submit pattern), so that a
page elsewhere cannot sign a browser in to an account of the attacker's.
"""

from __future__ import annotations

import hmac
import secrets

from aiohttp import web

from llmgw.bodies import read_fields
from llmgw.store.sessions import Session, lookup_session
from llmgw.store.users import User, get_user
from llmgw.web.context import WEB_KEY

SESSION_COOKIE = "llmgw_session"
CSRF_COOKIE = "llmgw_csrf"

PRE_SESSION_CSRF = web.RequestKey("llmgw.web.pre_session_csrf", str)
_SESSION = web.RequestKey("llmgw.web.session", object)


def _secure(request: web.Request) -> bool:
    return request.secure or request.headers.get("X-Forwarded-Proto", "").lower() == "https"


def set_cookie(
    response: web.StreamResponse,
    request: web.Request,
    name: str,
    value: str,
    max_age: int | None,
    *,
    cross_site_post: bool = False,
) -> None:
    """cross_site_post: the cookie must come back on a form another site posts here (a SAML
    provider's answer), which SameSite=Lax forbids; SameSite=None is only honoured with Secure, so
    such a cookie needs HTTPS."""
    response.set_cookie(
        name,
        value,
        max_age=max_age,
        path="/",
        httponly=True,
        samesite=_same_site(request, cross_site_post),
        secure=_secure(request),
    )


def _same_site(request: web.Request, cross_site_post: bool) -> str:
    return "None" if cross_site_post and _secure(request) else "Lax"


def clear_cookie(
    response: web.StreamResponse, request: web.Request, name: str, *, cross_site_post: bool = False
) -> None:
    response.del_cookie(
        name, path="/", httponly=True, samesite=_same_site(request, cross_site_post), secure=_secure(request)
    )


async def _lookup(request: web.Request) -> tuple[Session, User] | None:
    if _SESSION in request:
        return request[_SESSION]  # type: ignore[return-value]
    found: tuple[Session, User] | None = None
    token = request.cookies.get(SESSION_COOKIE)
    if token:
        store = request.config_dict[WEB_KEY].store
        session = await lookup_session(store, token)
        user = await get_user(store, session.user_id) if session is not None else None
        # A disabled account's sessions are ended when it is disabled; checking
        # here too covers a store edited by hand.
        if session is not None and user is not None and user.active:
            found = (session, user)
    request[_SESSION] = found
    return found


async def current_user(request: web.Request) -> User | None:
    """The active user the request's session cookie names, looked up once per request."""
    found = await _lookup(request)
    return found[1] if found is not None else None


async def current_session(request: web.Request) -> Session | None:
    found = await _lookup(request)
    return found[0] if found is not None else None


def pre_session_csrf(request: web.Request) -> str:
    """The CSRF token for a form shown before sign-in: the browser's cookie, or a new one for this page.

    The caller sets the cookie with `remember_pre_session_csrf` on its response.
    """
    if PRE_SESSION_CSRF not in request:
        request[PRE_SESSION_CSRF] = request.cookies.get(CSRF_COOKIE) or secrets.token_urlsafe(32)
    return request[PRE_SESSION_CSRF]


def remember_pre_session_csrf(response: web.StreamResponse, request: web.Request) -> None:
    if PRE_SESSION_CSRF in request and request.cookies.get(CSRF_COOKIE) != request[PRE_SESSION_CSRF]:
        set_cookie(response, request, CSRF_COOKIE, request[PRE_SESSION_CSRF], max_age=None)


async def check_pre_session_csrf(request: web.Request) -> bool:
    """Whether a form posted before sign-in carries the token of the browser's CSRF cookie."""
    cookie = request.cookies.get(CSRF_COOKIE, "")
    sent = (await read_fields(request)).get("csrf", "")
    return bool(cookie) and hmac.compare_digest(cookie, sent)
