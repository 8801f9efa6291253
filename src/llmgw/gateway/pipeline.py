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
from typing import TYPE_CHECKING, Any

import attrs
from aiohttp import web

from llmgw import bodies
from llmgw.config import TimeoutsConfig
from llmgw.gateway.apis import CHAT, Api
from llmgw.gateway.errors import ApiError
from llmgw.routes import EngineRoute
from llmgw.store.keys import KeyRecord

if TYPE_CHECKING:
    from llmgw.gateway.translation import Translation


@attrs.define
class Call:
    """What the stages learn about one request as it goes through them."""

    request: web.Request
    # The API the request was sent to (apis.py): how its body is read, reserved, counted and refused.
    api: Api = CHAT
    key: KeyRecord | None = None
    body: bytes = b""
    payload: dict[str, Any] = attrs.field(factory=dict)
    model: str = ""
    endpoint: str = ""
    # The form's fields other than its files, for a multipart API (the body is forwarded as it came).
    form: dict[str, str] = attrs.field(factory=dict, repr=False)
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
    # Set by the proxy when a stream is cut short (the engine failed or was given up, the client left):
    # the completion events the client had by then, what admission charges for (and never less) in
    # place of the reservation.
    delivered: int | None = None
    # Set by the proxy for a request whose engine does not speak its API (translation.py): the chat
    # completions path it goes to instead; "" for the request's own path.
    upstream_path: str = ""
    # Set by the proxy with upstream_path: how the chat completion is said back in the request's API.
    translation: Translation | None = attrs.field(default=None, repr=False)
    # Set by the proxy with `delivered`: the prompt tokens the stream had reported before it broke
    # (Anthropic's message_start says them first), charged in place of the reserved prompt.
    delivered_prompt: int | None = None


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


def endpoint(handler: Handler, api: Api = CHAT) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    """An aiohttp handler running a composed chain for api, turning its refusals into api's errors."""
    shape = api.errors

    async def handle(request: web.Request) -> web.StreamResponse:
        try:
            return await handler(Call(request, api))
        except ApiError as err:
            return err.response(shape)

    return handle


async def read_request(call: Call, rest: Handler) -> web.StreamResponse:
    """Read the body once and find the model; the proxy forwards these same bytes."""
    if call.api.body == "multipart":
        return await _read_form(call, rest)
    try:
        payload = await bodies.read_json(call.request, call.api.max_body or None)
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
    # Before the API's check, so that a body it refuses is counted under the model it named.
    call.model = model
    if call.api.check is not None:
        call.api.check(payload)
    return await rest(call)


async def _read_form(call: Call, rest: Handler) -> web.StreamResponse:
    """A multipart form (an audio upload): its fields read, its bytes kept as they came."""
    try:
        form = await bodies.read_form(call.request, call.api.max_body or None)
    except bodies.BadForm as exc:
        raise ApiError(exc.status, str(exc), code="invalid_body") from None
    model = form.fields.get("model", "")
    if not model:
        raise ApiError(
            400, "the form does not name a model: add a 'model' field", code="missing_model", param="model"
        )
    call.body = form.raw
    call.form = form.fields
    call.model = model
    return await rest(call)
