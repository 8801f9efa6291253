"""A request to an endpoint outside the fleet (endpoints.py): its URL, and its refusals in words.

A replica's engine is the gateway's own: a 4xx from it is about the client's
request and goes to the client as it came. An endpoint is someone else's
server, reached with the gateway's key for it, and its refusals are mostly
about that: a 401 passed on told a client holding a good llmgw key that its key
was wrong, and a cloud API's 401 quotes the start of the key it was given. So
401 and 403 (the endpoint's key), 404 (a model it does not know) and 429 (it
limits the gateway) become errors naming the endpoint, never its key; any other
4xx is the client's own and goes on, with the key struck out of it should the
endpoint quote it.
"""

from __future__ import annotations

import json

from aiohttp import hdrs
from multidict import CIMultiDictProxy

from llmgw.gateway.errors import ApiError
from llmgw.gateway.faults import EngineFailed, excerpt, scrub, where
from llmgw.gateway.pipeline import Call

# How much of a refusal is read to say it, or to pass it on.
REFUSAL_BODY = 64 * 1024
# How much of the endpoint's own words a sentence quotes.
_SAID = 200


def is_endpoint(call: Call) -> bool:
    return call.route is not None and bool(call.route.url)


def url_of(call: Call) -> str:
    """Where the request goes: the replica's address and the request's path, or the endpoint's base URL and
    the path after /v1 (an endpoint's base URL names its own version prefix, `/v1` or another)."""
    route = call.route
    path = call.upstream_path or call.request.path_qs
    if route is not None and route.url:
        return route.url + (path[3:] if path.startswith("/v1/") else path)
    return call.endpoint + path


def refusal(call: Call, status: int, headers: CIMultiDictProxy[str], body: bytes) -> ApiError | None:
    """The error for an endpoint's refusal; None for one that is the client's to read (a 400, a 422)."""
    assert call.route is not None
    route = call.route
    model = call.served_model or call.model
    if status in (401, 403):
        # Not its words: a cloud API's quote the start and end of the key it was given.
        message = f"{model} on {where(call)} answered {status}: the gateway's key for it is wrong"
        # Every request would be refused the same: none goes there until a check finds the key good.
        route.refused(f"{route.url} answered {status} to a request: its key is wrong")
        return EngineFailed(502, message, type="server_error", code="upstream_key_refused")
    said = _said(call, body)
    if status == 404:
        return EngineFailed(
            502,
            f"{model} on {where(call)} answered 404: it does not know the model '{route.upstream_model}' or "
            f"does not serve {call.request.path}{said}",
            type="server_error",
            code="upstream_model_not_found",
        )
    if status == 429:
        after = headers.get(hdrs.RETRY_AFTER, "")
        wait = f"; it asks to retry after {after} s" if after else ""
        return EngineFailed(
            429,
            f"{model} on {where(call)} is limiting the gateway's requests (429){wait}{said}",
            type="rate_limit_error",
            code="upstream_rate_limited",
            headers={hdrs.RETRY_AFTER: after} if after else None,
        )
    return None


def _said(call: Call, body: bytes) -> str:
    """The endpoint's own message, struck of its key, as the end of a sentence; "" when it said none."""
    body = scrub(call, body)
    try:
        error = json.loads(body)["error"]
        message = error if isinstance(error, str) else error["message"]
    except (ValueError, KeyError, TypeError):
        message = excerpt(body, _SAID) if body.strip() else ""
    if not isinstance(message, str) or not message:
        return ""
    return f" (it said: {excerpt(message.encode(), _SAID)})"
