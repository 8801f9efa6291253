"""The sim engine's HTTP server: an OpenAI-compatible engine that needs no model.

It answers what a real engine answers (/health, /v1/models, /v1/chat/completions,
/v1/completions, streamed or not, /metrics) with deterministic text, so the
whole system can run and be tested on a machine without weights or a GPU, and
so the gateway benchmark has a baseline that costs next to nothing.

What it says, so tests can rely on it:

- The reply echoes the tokens of the prompt (the last message for chat, the
  prompt for completions), at most ``max_tokens`` of them (default 16;
  ``max_completion_tokens`` wins for chat). ``finish_reason`` is "length" when
  the prompt had more tokens than that, "stop" otherwise. A chat request whose
  ``tool_choice`` is "required" (the first function) or names a function is
  answered with one call of it in ``tool_calls`` (one chunk when streamed),
  with the least arguments its schema takes, no content, no completion
  tokens and ``finish_reason`` "tool_calls".
- A token is a run of ASCII characters between whitespace, or a single
  character outside ASCII (each CJK character, each emoji code point is one),
  as a real tokenizer counts such text: never more tokens than the text has
  UTF-8 bytes, and many more than a byte count over four for prompts of
  one-letter words or CJK. ``prompt_tokens`` counts the tokens of every message
  (text parts of list contents included), ``completion_tokens`` those of the
  reply. The reply echoes the prompt's tokens, with a space where it had whitespace.
- ``ttft_ms`` delays the first token and ``tokens_per_s`` paces the rest; zero
  means no delay at all, not a zero-length sleep.
- A stream with ``stream_options.include_usage`` has one more chunk before
  ``data: [DONE]``: no choices, the usage of the whole request. The other
  chunks are the same bytes as without it (no ``"usage":null``), as vLLM and
  llama-server send them.
- /v1/embeddings answers every input (a string, a list of strings, a list of
  token ids or a list of such lists) with a unit vector of ``EMBEDDING_DIM``
  numbers drawn from the input's SHAKE-256 digest: the same input always gets
  the same vector, another input another one. ``prompt_tokens`` counts the
  inputs' tokens as above (a token id is one); ``encoding_format: "base64"``
  sends each vector as little-endian float32, as OpenAI does.
- With LLMGW_ENGINE_API_KEY set, every path but /health wants
  ``Authorization: Bearer <that secret>`` and answers 401 otherwise, as
  llama-server does with its --api-key.
- /metrics has ``llmgw_sim_requests_in_flight`` and
  ``llmgw_sim_completion_tokens_total``, which moves as each token is produced
  (all at once for an undelayed reply): what the agent's stall probe reads.
- Two signals break it on purpose while the process lives, for the agent's
  stall probe to find: SIGUSR1 makes its serving loop dead (/health and every
  completion answer 500, as vLLM does after an EngineDeadError); SIGUSR2 makes
  generation hang (completions are taken in and never produce a token; /health
  still answers). Neither can be undone: a broken engine is replaced.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import hashlib
import hmac
import itertools
import json
import math
import os
import signal
import struct
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, generate_latest

from llmgw import __version__, strictjson
from llmgw.engines import sim_apis
from llmgw.engines.sim_text import (
    DEFAULT_MAX_TOKENS,
    BadRequest,
    Request,
    dead,
    error_response,
    escaped,
    requested_max,
    text_of,
    tokens,
)
from llmgw.engines.sim_words import API_KEY_ENV, COMPLETION_TOKENS_METRIC, IN_FLIGHT_METRIC

__all__ = ["DEFAULT_MAX_TOKENS", "EMBEDDING_DIM", "embedding", "main", "make_sim_app"]

EMBEDDING_DIM = 64

_SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
_DONE = "data: [DONE]\n\n"
# Pieces of streamed choices, filled with %: the text is already escaped for a JSON string.
_CHAT_ROLE = '{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null'
_CHAT_TOKEN = '{"index":0,"delta":{"content":"%s"},"logprobs":null,"finish_reason":null'
_CHAT_TOOL_CALLS = '{"index":0,"delta":{"tool_calls":%s},"logprobs":null,"finish_reason":null'
_CHAT_FINISH = '{"index":0,"delta":{},"logprobs":null,"finish_reason":"%s"'
_TEXT_TOKEN = '{"index":0,"text":"%s","logprobs":null,"finish_reason":null'
_TEXT_FINISH = '{"index":0,"text":"","logprobs":null,"finish_reason":"%s"'


def _parse_chat(body: dict[str, Any]) -> Request:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BadRequest(400, "messages must be a non-empty list of messages", param="messages")
    prompt_tokens = 0
    last: list[str] = []
    for message in messages:
        if not isinstance(message, dict):
            raise BadRequest(400, "every message must be an object with role and content", param="messages")
        last = tokens(text_of(message.get("content")))
        prompt_tokens += len(last)
    limit = requested_max(body, ("max_completion_tokens", "max_tokens"))
    return Request(prompt_tokens, last, limit, body, sim_apis.forced_chat_tool(body))


def _parse_completion(body: dict[str, Any]) -> Request:
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        words = tokens(prompt)
        prompt_tokens = len(words)
    elif isinstance(prompt, list) and all(isinstance(p, str) for p in prompt):
        words = tokens(prompt[-1]) if prompt else []
        prompt_tokens = sum(len(tokens(p)) for p in prompt)
    else:
        raise BadRequest(400, "prompt must be a string or a list of strings", param="prompt")
    return Request(prompt_tokens, words, requested_max(body, ("max_tokens",)), body)


def embedding(item: str | list[int]) -> list[float]:
    """The sim's vector for one input: EMBEDDING_DIM numbers from its digest, scaled to length 1."""
    data = item.encode() if isinstance(item, str) else strictjson.dumps(item).encode()
    raw = hashlib.shake_256(data).digest(2 * EMBEDDING_DIM)
    values = [v - 32767.5 for v in struct.unpack(f"<{EMBEDDING_DIM}H", raw)]
    norm = math.sqrt(sum(v * v for v in values))
    return [v / norm for v in values]


def _inputs(body: dict[str, Any]) -> list[str | list[int]]:
    """The request's inputs, one per vector; a BadRequest for anything else."""
    value: Any = body.get("input")

    def token_ids(item: Any) -> bool:
        return (
            isinstance(item, list)
            and bool(item)
            and all(isinstance(t, int) and not isinstance(t, bool) for t in item)
        )

    if isinstance(value, str) and value:
        return [value]
    if token_ids(value):
        return [value]
    if isinstance(value, list) and value and all((isinstance(v, str) and v) or token_ids(v) for v in value):
        return list(value)
    raise BadRequest(
        400,
        "input must be a non-empty string, a list of them, a list of token ids or a list of such lists",
        param="input",
    )


class _SimServer:
    """The handlers and metrics of one sim app."""

    def __init__(self, model: str, ttft_ms: float, tokens_per_s: float):
        self.model = model
        self.model_json = strictjson.dumps(model)
        self.ttft_s = ttft_ms / 1000.0
        self.token_interval_s = 1.0 / tokens_per_s if tokens_per_s > 0 else 0.0
        self.delayed = self.ttft_s > 0 or self.token_interval_s > 0
        self.ids = itertools.count(1)
        self.created = int(time.time())
        self.registry = CollectorRegistry(auto_describe=False)
        self.in_flight = Gauge(
            IN_FLIGHT_METRIC,
            "Completion requests being answered now.",
            registry=self.registry,
        )
        requests = Counter(
            "llmgw_sim_requests", "Completion requests received.", ["endpoint"], registry=self.registry
        )
        # Bound once: looking a label up per request is work the benchmark would measure.
        self.chat_requests = requests.labels("chat")
        self.completion_requests = requests.labels("completions")
        self.requests = requests
        self.prompt_tokens = Counter(
            "llmgw_sim_prompt_tokens", "Prompt tokens received.", registry=self.registry
        )
        self.completion_tokens = Counter(
            COMPLETION_TOKENS_METRIC.removesuffix("_total"),
            "Completion tokens produced, counted as each is.",
            registry=self.registry,
        )
        # The fault switches (SIGUSR1, SIGUSR2): set once, never cleared.
        self.dead = False
        self.stuck = asyncio.Event()
        models = {
            "object": "list",
            "data": [{"id": model, "object": "model", "created": self.created, "owned_by": "llmgw-sim"}],
        }
        self.models_body = strictjson.dumps(models).encode()

    def break_serving_loop(self) -> None:
        """From now on /health and every completion answer 500, as a vLLM whose engine core died."""
        self.dead = True

    def hang_generation(self) -> None:
        """From now on completions are taken in and never produce a token; /health still answers."""
        self.stuck.set()

    async def health(self, request: web.Request) -> web.Response:
        if self.dead:
            return error_response(dead())
        return web.Response(body=b'{"status":"ok"}', content_type="application/json")

    async def models(self, request: web.Request) -> web.Response:
        return web.Response(body=self.models_body, content_type="application/json")

    async def metrics(self, request: web.Request) -> web.Response:
        body = generate_latest(self.registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def _body(self, request: web.Request) -> dict[str, Any]:
        try:
            body = json.loads(await request.read())
        except ValueError as e:
            raise BadRequest(400, f"the request body is not valid JSON: {e}") from None
        if not isinstance(body, dict):
            raise BadRequest(400, "the request body must be a JSON object")
        model = body.get("model")
        if model is not None and model != self.model:
            raise BadRequest(
                404,
                f"The model `{model}` does not exist; this engine serves `{self.model}`.",
                param="model",
                code="model_not_found",
            )
        return body

    async def chat(self, request: web.Request) -> web.StreamResponse:
        self.chat_requests.inc()
        self.in_flight.inc()
        try:
            parsed = _parse_chat(await self._body(request))
            await self._serving_loop()
            self._count(parsed)
            if parsed.stream:
                return await self._stream(request, self._chat_chunks(parsed), len(parsed.reply))
            await self._generate_delay(parsed)
            reply = {
                "id": f"chatcmpl-sim-{next(self.ids)}",
                "object": "chat.completion",
                "created": int(time.time()),
                "model": self.model,
                "choices": [
                    {
                        "index": 0,
                        "message": self._chat_message(parsed),
                        "logprobs": None,
                        "finish_reason": parsed.finish_reason,
                    }
                ],
                "usage": parsed.usage(),
            }
            return web.Response(body=strictjson.dumps(reply), content_type="application/json")
        except BadRequest as e:
            return error_response(e)
        finally:
            self.in_flight.dec()

    async def completions(self, request: web.Request) -> web.StreamResponse:
        self.completion_requests.inc()
        self.in_flight.inc()
        try:
            parsed = _parse_completion(await self._body(request))
            await self._serving_loop()
            self._count(parsed)
            if parsed.stream:
                return await self._stream(request, self._completion_chunks(parsed), len(parsed.reply))
            await self._generate_delay(parsed)
            reply = {
                "id": f"cmpl-sim-{next(self.ids)}",
                "object": "text_completion",
                "created": int(time.time()),
                "model": self.model,
                "choices": [
                    {
                        "index": 0,
                        "text": "".join(parsed.reply),
                        "logprobs": None,
                        "finish_reason": parsed.finish_reason,
                    }
                ],
                "usage": parsed.usage(),
            }
            return web.Response(body=strictjson.dumps(reply), content_type="application/json")
        except BadRequest as e:
            return error_response(e)
        finally:
            self.in_flight.dec()

    async def embeddings(self, request: web.Request) -> web.StreamResponse:
        try:
            body = await self._body(request)
            inputs = _inputs(body)
            encoding = body.get("encoding_format", "float")
            if encoding not in ("float", "base64"):
                raise BadRequest(400, "encoding_format must be float or base64", param="encoding_format")
        except BadRequest as e:
            return error_response(e)
        count = sum(len(tokens(i)) if isinstance(i, str) else len(i) for i in inputs)
        self.prompt_tokens.inc(count)
        data = []
        for index, item in enumerate(inputs):
            vector: list[float] | str = embedding(item)
            if encoding == "base64":
                packed = struct.pack(f"<{EMBEDDING_DIM}f", *vector)
                vector = base64.b64encode(packed).decode()
            data.append({"object": "embedding", "index": index, "embedding": vector})
        reply = {
            "object": "list",
            "data": data,
            "model": self.model,
            "usage": {"prompt_tokens": count, "total_tokens": count},
        }
        return web.Response(body=strictjson.dumps(reply), content_type="application/json")

    async def messages(self, request: web.Request) -> web.StreamResponse:
        return await self._generated(
            request, "messages", sim_apis.parse_messages, sim_apis.message_reply, sim_apis.message_events
        )

    async def responses(self, request: web.Request) -> web.StreamResponse:
        return await self._generated(
            request, "responses", sim_apis.parse_responses, sim_apis.response_reply, sim_apis.response_events
        )

    async def _generated(
        self,
        request: web.Request,
        endpoint: str,
        parse: Callable[[dict[str, Any]], sim_apis.Turns],
        reply: Callable[[sim_apis.Turns, Iterator[int], str], dict[str, Any]],
        events: Callable[[sim_apis.Turns, Iterator[int], str], Iterator[str]],
    ) -> web.StreamResponse:
        """A Messages or Responses request, answered or streamed as the chat route does."""
        self.requests.labels(endpoint).inc()
        self.in_flight.inc()
        try:
            turns = parse(await self._body(request))
            await self._serving_loop()
            self._count(turns)
            if turns.stream:
                return await self._stream(request, events(turns, self.ids, self.model), len(turns.reply))
            await self._generate_delay(turns)
            body = strictjson.dumps(reply(turns, self.ids, self.model))
            return web.Response(body=body, content_type="application/json")
        except BadRequest as e:
            return sim_apis.anthropic_error(e) if endpoint == "messages" else error_response(e)
        finally:
            self.in_flight.dec()

    async def count_tokens(self, request: web.Request) -> web.Response:
        try:
            turns = sim_apis.parse_messages(await self._body(request), counting=True)
        except BadRequest as e:
            return sim_apis.anthropic_error(e)
        return strictjson.response({"input_tokens": turns.prompt_tokens})

    async def rerank(self, request: web.Request) -> web.Response:
        try:
            body = await self._body(request)
            answer = sim_apis.score_reply if request.path == "/v1/score" else sim_apis.rerank_reply
            reply = answer(body, self.ids, self.model)
        except BadRequest as e:
            return error_response(e)
        self.prompt_tokens.inc(reply["usage"]["prompt_tokens"])
        return strictjson.response(reply)

    async def transcriptions(self, request: web.Request) -> web.Response:
        form = await request.post()
        upload, model = form.get("file"), str(form.get("model", ""))
        try:
            if model != self.model:
                raise BadRequest(
                    404,
                    f"The model `{model}` does not exist; this engine serves `{self.model}`.",
                    param="model",
                    code="model_not_found",
                )
            if not isinstance(upload, web.FileField):
                raise BadRequest(400, "file: an audio file is required", param="file")
            # Past a megabyte aiohttp spools the upload to a file on disk.
            audio = await asyncio.to_thread(upload.file.read)
            response_format = form.get("response_format", "json")
            body, content_type = sim_apis.transcription_reply(audio, str(response_format))
        except BadRequest as e:
            return error_response(e)
        return web.Response(body=body, content_type=content_type)

    async def _serving_loop(self) -> None:
        """Raise the 500 of a dead serving loop, or never return while generation hangs."""
        if self.dead:
            raise dead()
        if self.stuck.is_set():
            # Forever: only the agent's SIGKILL ends this request.
            await asyncio.Event().wait()

    def _count(self, parsed: Request | sim_apis.Turns) -> None:
        self.prompt_tokens.inc(parsed.prompt_tokens)
        if not self.delayed:
            self.completion_tokens.inc(len(parsed.reply))

    async def _generate_delay(self, parsed: Request | sim_apis.Turns) -> None:
        # Token by token, each counted as it is produced, as a real engine's counter moves: a long
        # answer at a slow pace is progress, not a stall.
        if not self.delayed:
            return
        for i in range(len(parsed.reply)):
            await asyncio.sleep(self.ttft_s if i == 0 else self.token_interval_s)
            self.completion_tokens.inc()

    # The chunk generators write JSON by hand from pieces escaped once per request: a json.dumps
    # per chunk would be most of the sim's cost in the streamed benchmark. Each yields the first
    # event (everything before the first token is due), one event per further token, then the tail.

    def _frame(self, prefix: str, kind: str) -> str:
        return (
            f'data: {{"id":"{prefix}-sim-{next(self.ids)}","object":"{kind}","created":{int(time.time())},'
            f'"model":{self.model_json},"choices":['
        )

    def _tool_calls(self, parsed: Request, *, streamed: bool) -> list[dict[str, Any]]:
        call = {
            "id": f"call_sim_{next(self.ids)}",
            "type": "function",
            "function": {"name": parsed.tool, "arguments": strictjson.dumps(parsed.arguments)},
        }
        # A streamed call says which of the message's calls it continues.
        return [{"index": 0, **call}] if streamed else [call]

    def _chat_message(self, parsed: Request) -> dict[str, Any]:
        if parsed.tool:
            return {
                "role": "assistant",
                "content": None,
                "tool_calls": self._tool_calls(parsed, streamed=False),
            }
        return {"role": "assistant", "content": "".join(parsed.reply)}

    def _chat_chunks(self, parsed: Request) -> Iterator[str]:
        head = self._frame("chatcmpl", "chat.completion.chunk")
        if parsed.tool:
            # The whole call in one chunk, after the role's: it is no token of the reply.
            calls = strictjson.dumps(self._tool_calls(parsed, streamed=True), separators=(",", ":"))
            return self._chunks(parsed, head, _CHAT_ROLE, _CHAT_TOOL_CALLS, _CHAT_FINISH, [calls])
        return self._chunks(parsed, head, _CHAT_ROLE, _CHAT_TOKEN, _CHAT_FINISH)

    def _completion_chunks(self, parsed: Request) -> Iterator[str]:
        head = self._frame("cmpl", "text_completion")
        return self._chunks(parsed, head, "", _TEXT_TOKEN, _TEXT_FINISH)

    @staticmethod
    def _chunks(
        parsed: Request, head: str, role: str, token: str, finish: str, words: list[str] | None = None
    ) -> Iterator[str]:
        # No `"usage":null` on the other chunks, as vLLM and llama-server send them: asked for usage
        # or not, a stream differs only by its last chunk, the one the gateway hides when it asked.
        end = "}]}\n\n"
        # The role event (chat only) goes out with the first token, as one write.
        pending = head + role + end if role else ""
        for word in escaped(parsed.reply) if words is None else words:
            yield pending + head + token % word + end
            pending = ""
        tail = pending + head + finish % parsed.finish_reason + end
        if parsed.include_usage:
            # OpenAI's last chunk: no choices, only the usage of the whole request.
            tail += head + '],"usage":' + strictjson.dumps(parsed.usage()) + "}\n\n"
        yield tail + _DONE

    async def _stream(self, request: web.Request, chunks: Iterator[str], tokens: int) -> web.StreamResponse:
        if not self.delayed:
            # Nothing to pace: one body, one write, and a Content-Length instead of chunked framing.
            return web.Response(body="".join(chunks).encode(), headers=_SSE_HEADERS)
        response = web.StreamResponse(headers=_SSE_HEADERS)
        await response.prepare(request)
        if self.ttft_s:
            await asyncio.sleep(self.ttft_s)
        for i, chunk in enumerate(chunks):
            if i and self.token_interval_s:
                await asyncio.sleep(self.token_interval_s)
            # One event per token, then the tail: every event but the last is a token produced.
            if i < tokens:
                self.completion_tokens.inc()
            await response.write(chunk.encode())
        await response.write_eof()
        return response


def _require_secret(secret: str) -> Middleware:
    expected = f"Bearer {secret}".encode()

    @web.middleware
    async def check(request: web.Request, handler: Handler) -> web.StreamResponse:
        # /health stays open, as llama-server leaves it: the agent's readiness check carries no secret.
        given = request.headers.get("Authorization", "").encode()
        if request.path != "/health" and not hmac.compare_digest(given, expected):
            return error_response(
                BadRequest(401, "this engine serves only callers holding its secret", code="invalid_api_key")
            )
        return await handler(request)

    return check


def make_sim_app(
    model: str, ttft_ms: float = 0, tokens_per_s: float = 0, secret: str = "", slots: int = 0
) -> web.Application:
    """The sim engine as an aiohttp application serving model.

    ttft_ms delays the first token; tokens_per_s paces the following ones (0: no delay).
    secret, when set, is required as `Authorization: Bearer` on every path but /health.
    slots, when set, is how many requests it serves at once; the others queue, as a real engine's do
    past its batch, so that a replica's capacity (and the load that needs another) can be simulated.
    """
    sim = _SimServer(model, ttft_ms, tokens_per_s)
    middlewares = [_require_secret(secret)] if secret else []
    if slots:
        middlewares.append(_slots(slots))
    # Benchmarks and tests send long prompts; aiohttp's 1 MiB default would refuse them.
    app = web.Application(client_max_size=64 * 1024 * 1024, middlewares=middlewares)
    app.router.add_get("/health", sim.health)
    app.router.add_get("/v1/models", sim.models)
    app.router.add_post("/v1/chat/completions", sim.chat)
    app.router.add_post("/v1/completions", sim.completions)
    app.router.add_post("/v1/embeddings", sim.embeddings)
    app.router.add_post("/v1/messages", sim.messages)
    app.router.add_post("/v1/messages/count_tokens", sim.count_tokens)
    app.router.add_post("/v1/responses", sim.responses)
    for path in ("/v1/rerank", "/rerank", "/v1/score"):
        app.router.add_post(path, sim.rerank)
    app.router.add_post("/v1/audio/transcriptions", sim.transcriptions)
    app.router.add_get("/metrics", sim.metrics)
    app[_SIM] = sim
    return app


_SIM = web.AppKey("sim", _SimServer)


def _slots(slots: int) -> Middleware:
    """Serve at most slots POSTs at once, the rest waiting their turn (their first token later)."""
    turns = asyncio.Semaphore(slots)

    @web.middleware
    async def limit(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.method != "POST":
            return await handler(request)
        async with turns:
            return await handler(request)

    return limit


async def _fault_switches(app: web.Application) -> None:
    """SIGUSR1 kills the serving loop, SIGUSR2 hangs generation: faults the agent's probe must find."""
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGUSR1, app[_SIM].break_serving_loop)
    loop.add_signal_handler(signal.SIGUSR2, app[_SIM].hang_generation)


def _arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m llmgw.engines.sim",
        description="An OpenAI-compatible engine that echoes the prompt; needs no model and no GPU.",
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    parser.add_argument("--port", type=int, required=True, help="port to listen on")
    parser.add_argument("--model", required=True, help="the model name this engine serves")
    parser.add_argument("--ttft-ms", type=float, default=0, help="delay before the first token (default 0)")
    parser.add_argument(
        "--tokens-per-s", type=float, default=0, help="pace of the following tokens; 0 means no delay"
    )
    parser.add_argument(
        "--slots", type=int, default=0, help="requests served at once, the rest queued; 0 means no limit"
    )
    parser.add_argument("--version", action="version", version=f"llmgw-sim {__version__}")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    """Serve the sim engine until SIGINT or SIGTERM."""
    args = _arguments(argv)
    # From the environment, not an option: argv is readable by every user of the machine.
    secret = os.environ.get(API_KEY_ENV, "")
    app = make_sim_app(
        args.model, ttft_ms=args.ttft_ms, tokens_per_s=args.tokens_per_s, secret=secret, slots=args.slots
    )
    # Only in a sim process of its own: a test serving the app in its own loop keeps its signals.
    app.on_startup.append(_fault_switches)

    def announce(_: str) -> None:
        # The supervisor keeps this process's output; one line says it came up and where.
        sys.stderr.write(f"llmgw-sim {__version__} serving {args.model} on http://{args.host}:{args.port}\n")
        sys.stderr.flush()

    # shutdown_timeout: SIGTERM lets in-flight requests finish, within the supervisor's grace.
    web.run_app(app, host=args.host, port=args.port, access_log=None, print=announce, shutdown_timeout=5.0)
