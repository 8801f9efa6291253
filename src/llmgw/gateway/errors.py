"""Errors in the shape of the API a request went to, so that its clients raise the right exception with
our sentence: Anthropic's on the Messages routes (/v1/messages*), OpenAI's everywhere else."""

from __future__ import annotations

import json
from typing import Literal

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware

from llmgw import strictjson


class ApiError(Exception):
    """A refusal the client sees as {"error": {"message", "type", "code", "param"}} with its status."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",
        code: str | None = None,
        param: str | None = None,
        headers: dict[str, str] | None = None,
        refusal: tuple[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.code = code
        self.param = param
        self.headers = headers
        # Admission's refusals: (the kind of scope that refused, why), counted by the gateway's metrics.
        self.refusal = refusal

    def body(self, shape: ErrorShape = "openai") -> dict[str, object]:
        """The error as the API of shape says it."""
        if shape == "anthropic":
            return {"type": "error", "error": {"type": anthropic_type(self.status), "message": self.message}}
        return {"error": {"message": self.message, "type": self.type, "code": self.code, "param": self.param}}

    def response(self, shape: ErrorShape = "openai") -> web.Response:
        body = self.body(shape)
        return web.Response(
            status=self.status,
            body=strictjson.dumps(body).encode(),
            content_type="application/json",
            headers=self.headers,
        )


ErrorShape = Literal["openai", "anthropic"]

# Anthropic's error types by status (docs.anthropic.com, "Errors"); its SDKs pick the exception from the
# status and show the type and message.
_ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
    529: "overloaded_error",
}
# The Messages API's routes: /v1/messages and /v1/messages/count_tokens.
ANTHROPIC_PREFIX = "/v1/messages"


def anthropic_type(status: int) -> str:
    """The `error.type` Anthropic gives a status."""
    if status in _ANTHROPIC_TYPES:
        return _ANTHROPIC_TYPES[status]
    return "api_error" if status >= 500 else "invalid_request_error"


def shape_of(path: str) -> ErrorShape:
    """The error shape of the API a path belongs to."""
    return "anthropic" if path.startswith(ANTHROPIC_PREFIX) else "openai"


def in_shape(shape: ErrorShape, status: int, body: bytes) -> bytes:
    """An engine's refusal in shape: OpenAI's error object said again in Anthropic's; else as it came."""
    if shape == "openai":
        return body
    try:
        said = json.loads(body)
    except ValueError:
        return body
    error = said.get("error") if isinstance(said, dict) and said.get("type") != "error" else None
    message = error.get("message") if isinstance(error, dict) else None
    if not isinstance(message, str):
        return body
    return strictjson.dumps(ApiError(status, message).body(shape)).encode()


# `llmgw ctl` and the OpenAPI document expect the admin API's own shape ({"error": "..."}).
_ADMIN_API = "/admin/api/"


def answer(
    request: web.Request,
    status: int,
    message: str,
    *,
    code: str | None = None,
    headers: dict[str, str] | None = None,
) -> web.Response:
    """A refusal in the shape of the API the request went to.

    OpenAI's, Anthropic's on the Messages routes, and under /admin/api/ the admin API's own: it answers
    on the client port as it does on the admin listener.
    """
    if request.path.startswith(_ADMIN_API):
        return strictjson.response({"error": message}, status=status, headers=headers)
    return ApiError(status, message, code=code, headers=headers).response(shape_of(request.path))


# The codes of a URL or header too long, the same whoever refuses it (bodies.decode_bodies, or
# llmgw.httpserver past what aiohttp's parser reads): a URL of 9 KiB and one of 90 are one mistake.
LONG_LINE_CODES = {414: "url_too_long", 431: "header_too_large"}


def unreadable(status: int, message: str) -> web.Response:
    """The gateway listener's answer to a request aiohttp could not read (llmgw.httpserver).

    OpenAI's shape whatever the path: the request line or a header is what could not be read, so
    neither its route nor the shape of the route's API is known.
    """
    if status >= 500:
        return ApiError(status, message, type="server_error", code="internal_error").response()
    return ApiError(status, message, code=LONG_LINE_CODES.get(status, "invalid_request")).response()


def route_errors(served: str) -> Middleware:
    """aiohttp's own refusals (unknown path, wrong method, body too large) in the route's shape too.

    served: the routes the gateway serves, in words, for the 404.
    """

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        try:
            return await handler(request)
        except web.HTTPException as exc:
            if exc.status < 400:
                raise
            code = {404: "not_found", 405: "method_not_allowed", 413: "request_too_large"}.get(exc.status)
            message = {
                404: f"there is no {request.path} here; the gateway serves {served}",
                405: f"{request.path} does not accept {request.method}",
            }.get(exc.status, exc.text or exc.reason)
            headers = {"Allow": exc.headers["Allow"]} if "Allow" in exc.headers else None
            return answer(request, exc.status, message, code=code, headers=headers)

    return middleware
