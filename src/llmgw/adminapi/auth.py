"""Who may use the admin API under /admin on the client port: an admin token, or an administrator's session.

The admin listener asks nothing (reaching it is the credential, web/admin_listener.py).
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import secrets
from collections.abc import Awaitable, Callable, Sequence

from aiohttp import web

from llmgw.adminapi.replies import error
from llmgw.adminapi.routes import Guard, Handler
from llmgw.config import ServerConfig


def new_token() -> str:
    """A new admin token; its prefix says what it is where it turns up (a shell history, a Secret)."""
    return f"llmgw-admin-{secrets.token_urlsafe(32)}"


def hash_token(token: str) -> str:
    """What server.yaml's admin_tokens holds for token."""
    return hashlib.sha256(token.encode()).hexdigest()


def token_allowed(authorization: str | None, hashes: Sequence[str]) -> bool:
    """Whether an Authorization header carries a token whose digest is one of hashes."""
    scheme, _, token = (authorization or "").strip().partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return False
    digest = hash_token(token.strip())
    return any(hmac.compare_digest(digest, h.strip().lower()) for h in hashes)


def admin_token_or_session(
    cfg: ServerConfig, is_admin_session: Callable[[web.Request], Awaitable[bool]]
) -> Guard:
    """The guard of the API on the client port: an admin token, or an administrator's session.

    is_admin_session decides whether the session may do what the request asks: a change from a
    session needs the session's CSRF token too, which a script does not have; scripts use an
    admin token, and the token is what `llmgw ctl --token` sends.
    """

    def guard(handler: Handler) -> Handler:
        @functools.wraps(handler)
        async def checked(request: web.Request) -> web.StreamResponse:
            if token_allowed(request.headers.get("Authorization"), cfg.admin_tokens):
                return await handler(request)
            if await is_admin_session(request):
                return await handler(request)
            return error(
                401,
                "the admin API here needs an admin token: send 'Authorization: Bearer <token>' with a "
                "token whose sha256 is in server.yaml's admin_tokens (`llmgw ctl new-token` makes one), "
                "or an administrator's session (a change also needs its CSRF token in X-CSRF-Token), "
                "or use the admin listener on the server itself",
            )

        return checked

    return guard
