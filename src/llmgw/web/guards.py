"""Which pages a visitor may see: require_login, require_admin and the 403 page.

Apart from sessions.py because the 403 is a page: render puts the signed-in
user on every page (so imports sessions), and a guard renders (so imports
render). With the guards in sessions.py the two modules imported each other.
"""

from __future__ import annotations

import functools
import hmac
from collections.abc import Awaitable, Callable
from urllib.parse import quote

from aiohttp import web

from llmgw.bodies import read_fields
from llmgw.store.sessions import Session
from llmgw.web.render import render
from llmgw.web.sessions import current_session, current_user

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


async def forbidden(request: web.Request, message: str) -> web.StreamResponse:
    return await render(request, "message.html", status=403, title="Not allowed", message=message)


async def _csrf_ok(request: web.Request, session: Session) -> bool:
    if request.method in ("GET", "HEAD", "OPTIONS"):
        return True
    sent = (await read_fields(request)).get("csrf", "")
    return hmac.compare_digest(sent, session.csrf)


async def _token_is_not_a_session(request: web.Request) -> web.StreamResponse:
    # Sent to /login, a script with an admin token followed the redirect and got the sign-in form
    # with a 200, as if it were the page it asked for.
    return await render(
        request,
        "message.html",
        status=401,
        title="Pages need a signed-in session",
        message=f"{request.path} is a page for a person signed in at /login; a token (the "
        "Authorization header) does not sign in. With an admin token, use the admin API: "
        "/admin/api/v1/openapi.json lists its paths.",
    )


def _to_login(request: web.Request) -> web.StreamResponse:
    target = request.path_qs if request.method == "GET" else request.path
    return web.Response(status=303, headers={"Location": f"/login?next={quote(target, safe='/')}"})


def _require(admin: bool) -> Callable[[Handler], Handler]:
    def decorate(handler: Handler) -> Handler:
        @functools.wraps(handler)
        async def checked(request: web.Request) -> web.StreamResponse:
            session = await current_session(request)
            user = await current_user(request)
            if session is None or user is None:
                if "Authorization" in request.headers:
                    return await _token_is_not_a_session(request)
                return _to_login(request)
            if admin and not user.is_admin:
                return await forbidden(
                    request, f"{request.path} is for administrators, and {user.email} is not one."
                )
            if not await _csrf_ok(request, session):
                return await forbidden(
                    request,
                    "This form was not sent from a page of this site in your session "
                    "(its CSRF token is missing or stale). Reload the page and try again.",
                )
            return await handler(request)

        return checked

    return decorate


require_login = _require(admin=False)
"""Decorator: the handler runs for a signed-in active user (CSRF checked on POST); others go to /login."""

require_admin = _require(admin=True)
"""Decorator: as require_login, and a user who is not an administrator gets a 403 page."""
