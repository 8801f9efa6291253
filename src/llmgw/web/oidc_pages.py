"""/login/oidc and its callback: the pages' side of signing in through the identity provider (oidc.py).

Every refusal is a page in words, the sign-in page with the reason above it, so that the person
(or the administrator they show it to) knows whether it was them, their groups, or the provider;
the local sign-in, where auth.oidc.local_accounts keeps it, is right there to use instead.
"""

from __future__ import annotations

import time

import structlog
from aiohttp import web

from llmgw.store.sessions import create_session
from llmgw.store.users import User
from llmgw.web.account import _local, _pre_session_page, _see_other, client_address
from llmgw.web.context import WEB_KEY
from llmgw.web.oidc import FLOW_COOKIE, FLOW_TTL_S, Flow, OidcError, sign_in
from llmgw.web.provider_accounts import SignInRefused
from llmgw.web.sessions import CSRF_COOKIE, SESSION_COOKIE, clear_cookie, set_cookie

log = structlog.get_logger(__name__)


async def refused(
    request: web.Request, reason: str, status: int, target: str = "/profile"
) -> web.StreamResponse:
    """The sign-in page saying why the provider's sign-in did not work; logged for the administrators."""
    log.warning(
        "sign-in through the identity provider refused", reason=reason, address=client_address(request)
    )
    response = await _pre_session_page(
        request,
        "login.html",
        status=status,
        next=target,
        email="",
        error=f"Signing in through the identity provider did not work: {reason}.",
    )
    clear_cookie(response, request, FLOW_COOKIE)
    return response


async def start(request: web.Request) -> web.StreamResponse:
    """Send the browser to the provider, keeping state, nonce and PKCE verifier in FLOW_COOKIE."""
    provider = request.config_dict[WEB_KEY].oidc
    target = _local(request.query.get("next", "/profile"))
    if provider is None:
        return await refused(request, "this server has no identity provider set up (auth.oidc)", 404, target)
    flow = Flow.new(target)
    try:
        location = await provider.authorization_url(flow)
    except OidcError as exc:
        return await refused(request, str(exc), 502, target)
    response = _see_other(location)
    set_cookie(response, request, FLOW_COOKIE, flow.cookie(), max_age=FLOW_TTL_S)
    return response


async def callback(request: web.Request) -> web.StreamResponse:
    """Check what the provider sent back, and sign the person in with a session of the pages."""
    ctx = request.config_dict[WEB_KEY]
    provider = ctx.oidc
    if provider is None:
        return await refused(request, "this server has no identity provider set up (auth.oidc)", 404)
    flow = Flow.from_cookie(request.cookies.get(FLOW_COOKIE, ""))
    if flow is None or time.time() - flow.started > FLOW_TTL_S:
        return await no_sign_in_under_way(request, FLOW_TTL_S)
    if request.query.get("state") != flow.state:
        return await refused(
            request,
            "the answer's state is not the one this sign-in sent, so it was refused; start again",
            400,
        )
    if "error" in request.query:
        detail = request.query.get("error_description") or request.query["error"]
        return await refused(request, f"the provider said: {detail[:200]}", 401, flow.next)
    code = request.query.get("code", "")
    if not code:
        return await refused(request, "the provider's answer has no authorization code", 400, flow.next)
    try:
        claims = await provider.exchange(code, flow)
        user = await sign_in(ctx.store, provider.cfg, claims)
    except SignInRefused as exc:
        return await refused(request, str(exc), 401, flow.next)
    response = await session_for(request, user, flow.next)
    clear_cookie(response, request, FLOW_COOKIE)
    return response


async def no_sign_in_under_way(request: web.Request, ttl_s: int) -> web.StreamResponse:
    """The refusal of a provider's answer that this browser started no sign-in for (or too long ago)."""
    return await refused(
        request,
        "this browser has no sign-in in progress (it was finished already, took longer than "
        f"{ttl_s // 60} minutes, or was started in another browser); start again",
        400,
    )


async def session_for(request: web.Request, user: User, target: str) -> web.StreamResponse:
    """A person the provider vouched for: refused while waiting for approval or disabled, else signed
    in with a session of the pages and sent on to target. The same for every kind of provider."""
    if user.status == "pending":
        return await refused(
            request, f"your account {user.email} is waiting for an administrator to approve it", 403
        )
    if user.status != "active":
        return await refused(
            request, f"the account {user.email} is disabled; ask an administrator if that is a mistake", 403
        )
    ctx = request.config_dict[WEB_KEY]
    token, _ = await create_session(ctx.store, user.id, ctx.cfg.auth.session_ttl_s)
    response = _see_other(_local(target))
    set_cookie(response, request, SESSION_COOKIE, token, max_age=int(ctx.cfg.auth.session_ttl_s))
    clear_cookie(response, request, CSRF_COOKIE)
    return response
