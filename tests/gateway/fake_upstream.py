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


@attrs.define
class FakeUpstream:
    """Its behaviour is set by `mode`: "ok", "401", "404", "429", "500", "400" (quoting the key it was
    sent), "hang" (nothing until `release`)."""

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
    def _error(status: int, message: str, headers: dict[str, str] | None = None) -> web.Response:
        body = {"error": {"message": message, "type": "invalid_request_error", "code": None}}
        return web.json_response(body, status=status, headers=headers)

    async def list_models(self, request: web.Request) -> web.Response:
        if not self._authorised(request):
            return self._error(401, "Incorrect API key provided")
        return web.json_response(
            {"object": "list", "data": [{"id": m, "object": "model"} for m in self.models]}
        )

    async def chat(self, request: web.Request) -> web.StreamResponse:
        payload = await request.json()
        self.received.append((payload, dict(request.headers)))
        sent = request.headers.get("Authorization", "").removeprefix("Bearer ")
        if self.mode == "401" or not self._authorised(request):
            # As a cloud API does: the start and end of the key it was given.
            return self._error(401, f"Incorrect API key provided: {sent[:6]}...{sent[-4:]}")
        if self.mode == "404" or payload.get("model") not in self.models:
            return self._error(404, f"The model `{payload.get('model')}` does not exist")
        if self.mode == "429":
            return self._error(429, "Rate limit reached for requests", {"Retry-After": "17"})
        if self.mode == "500":
            return self._error(500, f"internal error while serving the key {sent}")
        if self.mode == "400":
            return self._error(400, f"max_tokens is too large for the key {sent}")
        if self.mode == "hang":
            await self.release.wait()
        usage = {
            "prompt_tokens": PROMPT_TOKENS,
            "completion_tokens": COMPLETION_TOKENS,
            "total_tokens": PROMPT_TOKENS + COMPLETION_TOKENS,
        }
        if not payload.get("stream"):
            message = {"role": "assistant", "content": "one two three"}
            return web.json_response(
                {
                    "id": "chatcmpl-1",
                    "object": "chat.completion",
                    "model": payload["model"],
                    "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
                    "usage": usage,
                }
            )
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for word in ("one", "two", "three"):
            chunk = {
                "id": "chatcmpl-1",
                "object": "chat.completion.chunk",
                "model": payload["model"],
                "choices": [{"index": 0, "delta": {"content": word}, "finish_reason": None}],
            }
            await response.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
        if (payload.get("stream_options") or {}).get("include_usage"):
            last = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "choices": [], "usage": usage}
            await response.write(b"data: " + json.dumps(last).encode() + b"\n\n")
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response


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
