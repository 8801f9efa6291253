"""Errors in OpenAI's shape, so that OpenAI's clients raise the right exception with our sentence."""

from __future__ import annotations

from aiohttp import web
from aiohttp.typedefs import Handler

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

    def response(self) -> web.Response:
        body = {"error": {"message": self.message, "type": self.type, "code": self.code, "param": self.param}}
        return web.Response(
            status=self.status,
            body=strictjson.dumps(body).encode(),
            content_type="application/json",
            headers=self.headers,
        )


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

    OpenAI's, except under /admin/api/: the admin API on the client port answers as it does on
    the admin listener.
    """
    if request.path.startswith(_ADMIN_API):
        return strictjson.response({"error": message}, status=status, headers=headers)
    return ApiError(status, message, code=code, headers=headers).response()


@web.middleware
async def openai_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """aiohttp's own refusals (unknown path, wrong method, body too large) in OpenAI's shape too."""
    try:
        return await handler(request)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        code = {404: "not_found", 405: "method_not_allowed", 413: "request_too_large"}.get(exc.status)
        message = {
            404: f"there is no {request.path} here; the gateway serves /v1/models, "
            "/v1/chat/completions and /v1/completions",
            405: f"{request.path} does not accept {request.method}",
        }.get(exc.status, exc.text or exc.reason)
        headers = {"Allow": exc.headers["Allow"]} if "Allow" in exc.headers else None
        return answer(request, exc.status, message, code=code, headers=headers)
