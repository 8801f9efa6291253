"""A fake OpenAI-compatible server on a loopback port: it checks its key, reports usage, streams, fails and
hangs on demand. What a model's `endpoints` lead to in the tests (and in scripts/bench_endpoints.py).

`python -m tests.gateway.fake_upstream ADDRESS PORT`, from the repository's root, serves one in a
process of its own (its default key and model) until SIGTERM: an endpoint on a host of its own in
tests/fleet/test_endpoints.py."""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
from collections.abc import AsyncIterator
from typing import Any

import attrs
from aiohttp import web
from aiohttp.test_utils import TestServer

KEY = "sk-upstream-0123456789-very-secret"
NAME = "upstream-model-name"
PROMPT_TOKENS = 7
COMPLETION_TOKENS = 3
# Every error the fake answers a chat with, as `mode`: a status, in OpenAI's shape or ("-text") in plain
# text. Each quotes the key it was sent, as a careless server may: only a gateway that strikes it out of
# every reply keeps it from the client, whatever the status.
ERROR_MODES = (
    *(str(status) for status in (400, 401, 403, 404, 409, 413, 422, 429, 500, 502, 503)),
    *(f"{status}-text" for status in (400, 404, 429, 500, 503)),
)


# A 200 whose content quotes the key it was sent, as an echo of the request or a debug field may: whole
# ("quote"), or cut in the middle of the key, the rest sent once `release` is set ("quote-split").
QUOTE_MODES = ("quote", "quote-split")


@attrs.define
class FakeUpstream:
    """Its behaviour is set by `mode`: "ok", one of ERROR_MODES (each quoting the key it was sent), one of
    QUOTE_MODES, "hang" (nothing until `release`)."""

    key: str = KEY
    models: list[str] = attrs.field(factory=lambda: [NAME])
    mode: str = "ok"
    received: list[tuple[dict[str, Any], dict[str, str]]] = attrs.field(factory=list)
    release: asyncio.Event = attrs.field(factory=asyncio.Event)
    url: str = ""

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/v1/models", self.list_models)
        app.router.add_post("/v1/chat/completions", self.chat)
        return app

    def _authorised(self, request: web.Request) -> bool:
        return request.headers.get("Authorization") == f"Bearer {self.key}"

    @staticmethod
    def _error(
        status: int, message: str, sent: str, headers: dict[str, str] | None = None, *, text: bool = False
    ) -> web.Response:
        said = f"{message} (for the key {sent})"
        if text:
            return web.Response(text=said, status=status, headers=headers)
        body = {"error": {"message": said, "type": "invalid_request_error", "code": None}}
        return web.json_response(body, status=status, headers=headers)

    async def list_models(self, request: web.Request) -> web.Response:
        if not self._authorised(request):
            sent = request.headers.get("Authorization", "").removeprefix("Bearer ")
            return self._error(401, "Incorrect API key provided", sent)
        return web.json_response(
            {"object": "list", "data": [{"id": m, "object": "model"} for m in self.models]}
        )

    async def chat(self, request: web.Request) -> web.StreamResponse:
        payload = await request.json()
        self.received.append((payload, dict(request.headers)))
        sent = request.headers.get("Authorization", "").removeprefix("Bearer ")
        if not self._authorised(request):
            # As a cloud API does: the start and end of the key it was given.
            return self._error(401, f"Incorrect API key provided: {sent[:6]}...{sent[-4:]}", sent)
        if self.mode in ERROR_MODES:
            return self._failed(payload, sent)
        if payload.get("model") not in self.models:
            return self._error(404, f"The model `{payload.get('model')}` does not exist", sent)
        if self.mode == "hang":
            await self.release.wait()
        usage = {
            "prompt_tokens": PROMPT_TOKENS,
            "completion_tokens": COMPLETION_TOKENS,
            "total_tokens": PROMPT_TOKENS + COMPLETION_TOKENS,
        }
        words = ["one", "two", "three"] + (
            [f"(sent with the key {sent})"] if self.mode in QUOTE_MODES else []
        )
        if not payload.get("stream"):
            message = {"role": "assistant", "content": " ".join(words)}
            reply = {
                "id": "chatcmpl-1",
                "object": "chat.completion",
                "model": payload["model"],
                "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
                "usage": usage,
            }
            if self.mode != "quote-split":
                return web.json_response(reply)
            return await self._split(request, "application/json", json.dumps(reply).encode(), sent)
        events: list[bytes] = []
        for word in words:
            chunk = {
                "id": "chatcmpl-1",
                "object": "chat.completion.chunk",
                "model": payload["model"],
                "choices": [{"index": 0, "delta": {"content": word}, "finish_reason": None}],
            }
            events.append(b"data: " + json.dumps(chunk).encode() + b"\n\n")
        if (payload.get("stream_options") or {}).get("include_usage"):
            last = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "choices": [], "usage": usage}
            events.append(b"data: " + json.dumps(last).encode() + b"\n\n")
        events.append(b"data: [DONE]\n\n")
        if self.mode == "quote-split":
            return await self._split(request, "text/event-stream", b"".join(events), sent)
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for event in events:
            await response.write(event)
        await response.write_eof()
        return response

    async def _split(
        self, request: web.Request, content_type: str, body: bytes, key: str
    ) -> web.StreamResponse:
        """body in two writes cut in the middle of key, the second once `release` is set."""
        cut = body.index(key.encode()) + len(key) // 2
        response = web.StreamResponse(headers={"Content-Type": content_type})
        await response.prepare(request)
        await response.write(body[:cut])
        await self.release.wait()
        await response.write(body[cut:])
        await response.write_eof()
        return response

    def _failed(self, payload: dict[str, Any], sent: str) -> web.Response:
        """The error `mode` names, in its words and with its headers."""
        code, _, form = self.mode.partition("-")
        status = int(code)
        message, headers = _MESSAGES.get(status, (f"the server failed with {status}", None))
        said = message.format(model=payload.get("model"), head=sent[:6], tail=sent[-4:])
        return self._error(status, said, sent, headers, text=form == "text")


_MESSAGES: dict[int, tuple[str, dict[str, str] | None]] = {
    400: ("max_tokens is too large", None),
    # As a cloud API does: the start and end of the key it was given.
    401: ("Incorrect API key provided: {head}...{tail}", None),
    404: ("The model `{model}` does not exist", None),
    429: ("Rate limit reached for requests", {"Retry-After": "17"}),
    500: ("internal error while serving the request", None),
}


@contextlib.asynccontextmanager
async def serve(upstream: FakeUpstream) -> AsyncIterator[FakeUpstream]:
    """Serve upstream on 127.0.0.1 until the generator is closed; its `url` is its base URL (…/v1)."""
    server = TestServer(upstream.app(), host="127.0.0.1", port=0)
    await server.start_server()
    upstream.url = f"http://127.0.0.1:{server.port}/v1"
    try:
        yield upstream
    finally:
        upstream.release.set()
        await server.close()


def main(argv: list[str]) -> None:
    address, port = argv
    web.run_app(FakeUpstream().app(), host=address, port=int(port), print=None)


if __name__ == "__main__":
    main(sys.argv[1:])
