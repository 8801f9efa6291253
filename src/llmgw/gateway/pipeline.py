"""A request's way through the gateway: a chain of stages around the proxy.

Each stage gets the call and the rest of the chain, like a middleware: it may
refuse (raise ApiError), fill in the call, and act after the rest has
finished (the router counts a request in flight until its stream ends).
The order is authenticate -> read_request -> route -> proxy; admission
(limits and budgets) slots in before route as one more stage, reserving
before calling the rest and settling in a `finally` after it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import attrs
from aiohttp import web

from llmgw import bodies
from llmgw.config import TimeoutsConfig
from llmgw.gateway.errors import ApiError
from llmgw.routes import EngineRoute
from llmgw.store.keys import KeyRecord


@attrs.define
class Call:
    """What the stages learn about one request as it goes through them."""

    request: web.Request
    key: KeyRecord | None = None
    body: bytes = b""
    payload: dict[str, Any] = attrs.field(factory=dict)
    model: str = ""
    endpoint: str = ""
    # Set by admission: the proxy then reads the engine's reported usage,
    # (prompt_tokens, completion_tokens), into `usage` as the reply passes.
    count_usage: bool = False
    usage: tuple[int, int] | None = None
    # Set by admission when it asked the engine for a stream's usage on the client's behalf: the
    # proxy hides the usage chunk the client did not ask for.
    hide_usage: bool = False
    # Set by admission: the proxy calls it with the reply's status once the whole reply is read,
    # before its last bytes go to the client, so that its usage is journaled first.
    done: Callable[[int], None] | None = None
    # The model whose replica serves the call: `model`, or one of its fallbacks (set by the router).
    served_model: str = ""
    # The endpoint's node, secret and lost signal (set by the router); None when the table has none.
    route: EngineRoute | None = attrs.field(default=None, repr=False)
    # The request's id: the client's x-request-id, else a fresh one; echoed in the reply and the log.
    request_id: str = ""
    # time.perf_counter() when the engine's reply began to go to the client (set by the proxy); 0: never.
    first_byte: float = 0.0
    # What the request cost, in the unit of prices and budgets (set by admission once it is settled).
    cost: float = 0.0
    # The served model's timeouts (set by the router; gateway/deadlines.py).
    timeouts: TimeoutsConfig = attrs.field(factory=TimeoutsConfig, repr=False)
    # Set by the proxy when the engine failed in the middle of a stream that reported no usage: the
    # completion events the client had by then, what admission charges for in place of the reservation.
    delivered: int | None = None


Handler = Callable[[Call], Awaitable[web.StreamResponse]]
Stage = Callable[[Call, Handler], Awaitable[web.StreamResponse]]


def compose(stages: Sequence[Stage], last: Handler) -> Handler:
    """One handler running the stages in order, then last."""
    handler = last
    for stage in reversed(stages):
        handler = _bind(stage, handler)
    return handler


def _bind(stage: Stage, rest: Handler) -> Handler:
    async def run(call: Call) -> web.StreamResponse:
        return await stage(call, rest)

    return run


def endpoint(handler: Handler) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    """An aiohttp handler running a composed chain, turning its refusals into OpenAI errors."""

    async def handle(request: web.Request) -> web.StreamResponse:
        try:
            return await handler(Call(request))
        except ApiError as err:
            return err.response()

    return handle


async def read_request(call: Call, rest: Handler) -> web.StreamResponse:
    """Read the body once and find the model; the proxy forwards these same bytes."""
    try:
        payload = await bodies.read_json(call.request)
    except bodies.BadJson as exc:
        raise ApiError(
            exc.status, str(exc), code="invalid_json" if exc.status == 400 else "request_too_large"
        ) from None
    body = await bodies.read(call.request)
    if not isinstance(payload, dict):
        raise ApiError(
            400, f"the request body must be a JSON object, not {type(payload).__name__}", code="invalid_json"
        )
    model = payload.get("model")
    if not isinstance(model, str) or not model:
        raise ApiError(
            400, "the request does not name a model: set 'model'", code="missing_model", param="model"
        )
    call.body = body
    call.payload = payload
    call.model = model
    return await rest(call)


# Inputs one /v1/embeddings request may hold: OpenAI's own limit. One request of 200,000 held its
# engine for minutes, every other request to that replica waiting, until the agent killed it.
MAX_EMBEDDING_INPUTS = 2048


async def bounded_inputs(call: Call, rest: Handler) -> web.StreamResponse:
    """Refuse, before anything is counted, an embeddings request of more than MAX_EMBEDDING_INPUTS inputs."""
    inputs = call.payload.get("input")
    # A list of token ids is one input; a list of strings, or of such lists, is one input each.
    if isinstance(inputs, list) and len(inputs) > MAX_EMBEDDING_INPUTS and not isinstance(inputs[0], int):
        raise ApiError(
            400,
            f"input holds {len(inputs):,} inputs; a request may hold at most {MAX_EMBEDDING_INPUTS:,}: "
            "send them in several requests",
            code="too_many_inputs",
            param="input",
        )
    return await rest(call)
