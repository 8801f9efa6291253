"""The pages every person uses: /login, /logout, /signup and /profile (password, own keys, own usage)."""

from __future__ import annotations

from collections import defaultdict
from datetime import UTC, date, datetime, timedelta
from urllib.parse import urlsplit

import attrs
from aiohttp import web

from llmgw.bodies import read_fields
from llmgw.names import key_name_problem
from llmgw.store.keys import KeyRecord, create_key, list_keys, revoke_key
from llmgw.store.scopes import Scope, load_hierarchy
from llmgw.store.sessions import create_session, end_session, end_user_sessions
from llmgw.store.usage import usage_by_day
from llmgw.store.users import (
    MIN_PASSWORD,
    AccountError,
    User,
    authenticate,
    create_user,
    has_password,
    link_key,
    set_password,
    user_key_ids,
    verify_password,
)
from llmgw.web.context import WEB_KEY
from llmgw.web.guards import forbidden, require_login
from llmgw.web.logins import Throttled
from llmgw.web.render import local_accounts, render
from llmgw.web.sessions import (
    CSRF_COOKIE,
    SESSION_COOKIE,
    check_pre_session_csrf,
    clear_cookie,
    current_session,
    current_user,
    pre_session_csrf,
    remember_pre_session_csrf,
    set_cookie,
)

USAGE_DAYS = 30

_STALE_FORM = (
    "This form was not sent from a page of this site (its CSRF token is missing or stale). "
    "Reload the page and try again."
)


def _see_other(location: str) -> web.Response:
    return web.Response(status=303, headers={"Location": location})


def _local(target: str) -> str:
    """target if it is a path on this site, else /profile: `next` must not send a person elsewhere.

    Nor hold what a Location header cannot: a CR or LF in it was a ValueError as the redirect was
    written, and the connection dropped with no answer.
    """
    parts = urlsplit(target)
    if (
        not target.startswith("/")
        or target.startswith("//")
        or parts.scheme
        or parts.netloc
        or "\\" in target
        or not target.isprintable()
    ):
        return "/profile"
    return target


def client_address(request: web.Request) -> str:
    """Who is signing in: the last X-Forwarded-For address (the one the proxy in front added), else the peer.

    Behind the TLS-terminating proxy the pages expect, every connection comes from the proxy:
    counting failures per peer would lock every person out at once.
    """
    forwarded = request.headers.getall("X-Forwarded-For", [])
    if forwarded:
        last = forwarded[-1].rsplit(",", 1)[-1].strip()
        if last:
            return last[:64]
    return request.remote or "unknown"


async def _pre_session_page(
    request: web.Request, template: str, status: int = 200, **context: object
) -> web.Response:
    pre_session_csrf(request)
    response = await render(request, template, status=status, **context)
    remember_pre_session_csrf(response, request)
    return response


async def login_page(request: web.Request) -> web.StreamResponse:
    if await current_user(request) is not None:
        return _see_other(_local(request.query.get("next", "/profile")))
    return await _pre_session_page(
        request, "login.html", next=_local(request.query.get("next", "/profile")), email="", error=None
    )


async def login(request: web.Request) -> web.StreamResponse:
    form = await read_fields(request)
    target = _local(form.get("next", "/profile"))
    email = form.get("email", "")
    if not await check_pre_session_csrf(request):
        return await _pre_session_page(
            request, "login.html", status=403, next=target, email=email, error=_STALE_FORM
        )
    ctx = request.config_dict[WEB_KEY]
    if not local_accounts(ctx.cfg.auth):
        return await _pre_session_page(
            request,
            "login.html",
            status=403,
            next=target,
            email=email,
            error="This server signs people in through the identity provider only; use the button above.",
        )
    try:
        with ctx.logins.attempt(email, client_address(request)) as attempt:
            user = await authenticate(ctx.store, email, form.get("password", ""))
            if user is None:
                attempt.failed()
            else:
                attempt.succeeded()
    except Throttled as exc:
        # The same words and wait for an email with no account as for one with: they must not
        # tell which emails have accounts.
        response = await _pre_session_page(
            request,
            "login.html",
            status=429,
            next=target,
            email=email,
            error=f"Too many failed sign-ins for this email or from your address. "
            f"Try again in {exc.retry_after_s} s.",
        )
        response.headers["Retry-After"] = str(exc.retry_after_s)
        return response
    error = None
    if user is None:
        error = "Wrong email or password."
    elif user.status == "pending":
        error = "Your account is waiting for an administrator to approve it."
    elif user.status == "disabled":
        error = "This account is disabled; ask an administrator if that is a mistake."
    if error is not None or user is None:
        return await _pre_session_page(
            request, "login.html", status=401, next=target, email=email, error=error
        )
    token, _ = await create_session(ctx.store, user.id, ctx.cfg.auth.session_ttl_s)
    response = _see_other(target)
    set_cookie(response, request, SESSION_COOKIE, token, max_age=int(ctx.cfg.auth.session_ttl_s))
    # The pre-session token has done its job; a new one is drawn at the next sign-in.
    clear_cookie(response, request, CSRF_COOKIE)
    return response


@require_login
async def logout(request: web.Request) -> web.StreamResponse:
    ctx = request.config_dict[WEB_KEY]
    user = await current_user(request)
    await end_session(ctx.store, request.cookies[SESSION_COOKIE])
    response = _see_other("/login")
    # Made by the OpenID Connect provider (no password here): end the provider's session too where
    # it offers RP-initiated logout, or the next "sign in" would go straight through.
    if ctx.oidc is not None and user is not None and user.source == "oidc":
        provider_logout = await ctx.oidc.logout_url(ctx.cfg.auth.oidc.base_url.rstrip("/") + "/login")
        if provider_logout is not None:
            response = _see_other(provider_logout)
    clear_cookie(response, request, SESSION_COOKIE)
    return response


def _signup_closed(request: web.Request) -> bool:
    return not request.config_dict[WEB_KEY].cfg.auth.signup_open


async def _closed(request: web.Request) -> web.StreamResponse:
    return await render(
        request,
        "message.html",
        status=404,
        title="Sign-up is closed",
        message="This server does not take sign-ups; ask an administrator for an account.",
    )


async def signup_page(request: web.Request) -> web.StreamResponse:
    if _signup_closed(request):
        return await _closed(request)
    return await _pre_session_page(request, "signup.html", email="", error=None, min_password=MIN_PASSWORD)


async def signup(request: web.Request) -> web.StreamResponse:
    if _signup_closed(request):
        return await _closed(request)
    form = await read_fields(request)
    email = form.get("email", "")

    async def again(error: str, status: int) -> web.StreamResponse:
        return await _pre_session_page(
            request, "signup.html", status=status, email=email, error=error, min_password=MIN_PASSWORD
        )

    if not await check_pre_session_csrf(request):
        return await again(_STALE_FORM, 403)
    if form.get("password", "") != form.get("password2", ""):
        return await again("The two passwords differ.", 400)
    try:
        await create_user(request.config_dict[WEB_KEY].store, email, form.get("password", ""))
    except AccountError as exc:
        return await again(f"{str(exc)[:1].upper()}{str(exc)[1:]}.", 400)
    return await render(
        request,
        "message.html",
        title="Account created",
        message=f"The account {email.strip()} is waiting for an administrator to approve it; "
        "you can log in once they have.",
    )


@attrs.frozen
class _UsageRow:
    day: date
    model: str
    requests: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost: float = 0.0


async def _own_keys(request: web.Request, user: User) -> list[KeyRecord]:
    store = request.config_dict[WEB_KEY].store
    own = set(await user_key_ids(store, user.id))
    return [key for key in await list_keys(store) if key.id in own]


async def _own_usage(request: web.Request, keys: list[KeyRecord]) -> list[_UsageRow]:
    """The last USAGE_DAYS days of the person's keys, per day and model, newest first."""
    store = request.config_dict[WEB_KEY].store
    since = datetime.now(UTC).date() - timedelta(days=USAGE_DAYS)
    totals: dict[tuple[date, str], list[float]] = defaultdict(lambda: [0, 0, 0, 0.0])
    for key in keys:
        for row in await usage_by_day(store, Scope("key", key.id), since=since):
            sums = totals[(row.day, row.model)]
            sums[0] += row.requests
            sums[1] += row.prompt_tokens
            sums[2] += row.completion_tokens
            sums[3] += row.cost
    return [
        _UsageRow(day, model, int(s[0]), int(s[1]), int(s[2]), s[3])
        for (day, model), s in sorted(totals.items(), key=lambda item: (item[0][0], item[0][1]), reverse=True)
    ]


async def _profile(request: web.Request, status: int = 200, **extra: object) -> web.StreamResponse:
    user = await current_user(request)
    assert user is not None
    ctx = request.config_dict[WEB_KEY]
    membership = "not in a project yet"
    if user.project_id is not None:
        hierarchy = await load_hierarchy(ctx.store)
        membership = hierarchy.name(Scope("project", user.project_id))
    keys = await _own_keys(request, user)
    context: dict[str, object] = {
        "membership": membership,
        "keys": keys,
        "usage": await _own_usage(request, keys),
        "usage_days": USAGE_DAYS,
        "min_password": MIN_PASSWORD,
        # An account the identity provider made has no password to change.
        "has_password": await has_password(ctx.store, user.id),
        "new_key": None,
        "new_key_name": None,
        "flash": None,
        "flash_kind": "ok",
    }
    context.update(extra)
    return await render(request, "profile.html", status=status, **context)


@require_login
async def profile(request: web.Request) -> web.StreamResponse:
    flash = {"password": "Your password is changed; your other sessions are ended."}.get(
        request.query.get("done", "")
    )
    return await _profile(request, flash=flash)


@require_login
async def change_password(request: web.Request) -> web.StreamResponse:
    user = await current_user(request)
    assert user is not None
    ctx = request.config_dict[WEB_KEY]
    form = await read_fields(request)
    row = await ctx.store.fetch_one("SELECT password_hash FROM users WHERE id = ?", (user.id,))
    # The current password is a password to guess too, for whoever holds a stolen session.
    try:
        with ctx.logins.attempt(user.email, client_address(request)) as attempt:
            right = (
                row is not None
                and row[0] is not None
                and await verify_password(form.get("current", ""), row[0])
            )
            if right:
                attempt.succeeded()
            else:
                attempt.failed()
    except Throttled as exc:
        response = await _profile(
            request,
            429,
            flash=f"Too many wrong passwords for this account. Try again in {exc.retry_after_s} s.",
            flash_kind="error",
        )
        response.headers["Retry-After"] = str(exc.retry_after_s)
        return response
    if not right:
        return await _profile(request, 400, flash="The current password is wrong.", flash_kind="error")
    if form.get("password", "") != form.get("password2", ""):
        return await _profile(request, 400, flash="The two new passwords differ.", flash_kind="error")
    try:
        await set_password(ctx.store, user.id, form.get("password", ""))
    except AccountError as exc:
        return await _profile(
            request, 400, flash=f"{str(exc)[:1].upper()}{str(exc)[1:]}.", flash_kind="error"
        )
    # Whoever else was signed in with the old password is signed out.
    await end_user_sessions(ctx.store, user.id, keep=request.cookies[SESSION_COOKIE])
    return _see_other("/profile?done=password")


@require_login
async def create_own_key(request: web.Request) -> web.StreamResponse:
    user = await current_user(request)
    assert user is not None
    if user.project_id is None:
        return await forbidden(
            request, "Keys belong to a project, and an administrator has not put you in one yet."
        )
    ctx = request.config_dict[WEB_KEY]
    name = (await read_fields(request)).get("name", "")
    problem = key_name_problem(name)
    if problem is not None:
        return await _profile(request, 400, flash=f"{problem[0].upper()}{problem[1:]}.", flash_kind="error")
    plaintext, record = await create_key(ctx.store, name, project_id=user.project_id)
    await link_key(ctx.store, record.id, user.id)
    # Rendered, not redirected: the key exists only in this response.
    return await _profile(request, new_key=plaintext, new_key_name=record.name)


@require_login
async def revoke_own_key(request: web.Request) -> web.StreamResponse:
    user = await current_user(request)
    assert user is not None
    key_id = int(request.match_info["key_id"])
    owned = {key.id: key for key in await _own_keys(request, user)}
    if key_id not in owned:
        return await forbidden(request, f"Key {key_id} is not one of yours.")
    await revoke_key(request.config_dict[WEB_KEY].store, owned[key_id].prefix)
    return _see_other("/profile")


async def root(request: web.Request) -> web.StreamResponse:
    return _see_other("/profile" if await current_session(request) is not None else "/login")
