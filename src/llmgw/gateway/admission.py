"""The admission stage: model allow-list, rate limits and budgets before routing; settlement and usage after.

Between read_request and route. What a request reserves is an upper bound of
what it can cost: its prompt at the bound of prompts.py (the bytes of the
text that reaches the model, plus the chat template's allowances), its completion at max_tokens (the model's
`max_tokens` when it names none, which the engine is then sent) times `n`. It
is settled to the usage the engine reports: the gateway asks for it on every
stream, and the proxy hides what the client did not ask for. The request's
usage is recorded (and journaled) before its last bytes go to the client.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import structlog
from aiohttp import web

from llmgw import strictjson
from llmgw.catalog import Catalog
from llmgw.config import ModelConfig, PriceConfig, ServerConfig
from llmgw.gateway import access
from llmgw.gateway.errors import ApiError
from llmgw.gateway.pipeline import Call, Handler
from llmgw.gateway.prompts import TEMPLATE_OVERHEAD as TEMPLATE_OVERHEAD  # where it was, for importers
from llmgw.gateway.quotas import Quotas, Short, Ticket
from llmgw.gateway.usage import UsageRecorder
from llmgw.pricing import cost, price_of
from llmgw.store.keys import KeyRecord
from llmgw.store.scopes import Hierarchy

_DEFAULT_MAX_TOKENS = ModelConfig().max_tokens

log = structlog.get_logger(__name__)


def _ask_the_engine(call: Call, max_tokens: int | None) -> None:
    """Rewrite the request so the engine stops where the reservation does and reports its usage."""
    payload = call.payload
    api = call.api
    changes: dict[str, Any] = {}
    if max_tokens is not None:
        # The engine's own default may be far longer (to the end of its context): it must stop
        # where the reservation does. In the API's own name for it (max_tokens, max_output_tokens).
        changes[api.limit[-1]] = max_tokens
    if api.stream_options and payload.get("stream") is True and not _wants_usage(payload):
        # Most clients stream without asking for usage; the engine's count is the only true one.
        options = payload.get("stream_options")
        changes["stream_options"] = {
            **(options if isinstance(options, dict) else {}),
            "include_usage": True,
        }
        call.hide_usage = True
    if changes:
        # The payload too: the router rewrites the body from it for a fallback model.
        call.payload = {**payload, **changes}
        call.body = strictjson.dumps(call.payload, ensure_ascii=False).encode()


def _used(call: Call, status: int, prompt: int, completion: int) -> tuple[int, int]:
    """What a finished request is charged: (prompt tokens, completion tokens)."""
    delivered = call.delivered
    if call.usage is not None:
        used = plausible_usage(call, call.usage, prompt, completion)
        if delivered is not None:
            # A stream cut short after the engine's last count: never less than the client had.
            used = (used[0], max(used[1], min(delivered, completion)))
        return used
    if status >= 400 and status != 499:
        return (0, 0)
    if delivered is not None:
        # A stream cut short (the client left, the engine broke off or was given up) before the engine
        # reported usage: the prompt it was sent (as the stream reported it, else as reserved) and a
        # token for each event of generated text the client had, never more than was reserved. A
        # client that leaves pays for what it was sent, not for its whole reservation: the engine
        # stops generating as the gateway closes its connection.
        sent = prompt if call.delivered_prompt is None else min(max(call.delivered_prompt, 0), prompt)
        return (sent, min(delivered, completion))
    # A whole reply that reports no usage (a server that does not count), or a request cancelled before
    # its reply began, is charged what was reserved: the bound is all that is known.
    return (prompt, completion)


def plausible_usage(call: Call, reported: tuple[int, int], prompt: int, completion: int) -> tuple[int, int]:
    """The engine's reported usage, held to what can be true of this request.

    An engine is a neighbour, not an authority: one reply claiming a trillion
    prompt tokens spent a whole budget, and a negative count gave it back with
    interest. Neither count is below zero; the prompt is at most what was
    reserved for it (prompts.py: never below what the engine can count) and
    the completion at most what was reserved for it (max_tokens times n). A
    report outside those bounds is logged with the replica that sent it.
    """
    reported_prompt, reported_completion = reported
    held = (min(max(reported_prompt, 0), prompt), min(max(reported_completion, 0), completion))
    if held != reported:
        route = call.route
        log.warning(
            "engine reported usage that cannot be true; charged what it can be",
            model=call.served_model or call.model,
            node=route.node_id if route is not None else None,
            replica=route.shard_id if route is not None else None,
            endpoint=call.endpoint,
            reported_prompt_tokens=reported_prompt,
            reported_completion_tokens=reported_completion,
            charged_prompt_tokens=held[0],
            charged_completion_tokens=held[1],
            request_id=call.request_id,
        )
    return held


def _asked(payload: dict[str, Any], name: str) -> int | None:
    value = payload.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ApiError(400, f"{name} must be a whole number of at least 1, not {value!r}", param=name)
    return value


def _choices(payload: dict[str, Any]) -> int:
    """How many completions the engine generates: n, or best_of (legacy completions) when larger."""
    if "n" not in payload and "best_of" not in payload:
        return 1  # most requests: two lookups, not four calls
    return max(_asked(payload, "n") or 1, _asked(payload, "best_of") or 1)


def _wants_usage(payload: dict[str, Any]) -> bool:
    options = payload.get("stream_options")
    return isinstance(options, dict) and options.get("include_usage") is True


# The usage row of requests for models this gateway does not have: no model's name starts with "(".
UNKNOWN_MODEL = "(unknown model)"


class Admission:
    """The pipeline stage; a call without a key (auth disabled) passes untouched."""

    def __init__(self, cfg: ServerConfig, catalog: Catalog, quotas: Quotas, recorder: UsageRecorder) -> None:
        self._cfg = cfg
        self._quotas = quotas
        self._recorder = recorder
        # The live catalog: a model added with ctl brings its own price.
        self._catalog = catalog
        self._generation = (-1, -1)
        self._terms_of: dict[str, tuple[PriceConfig | None, int]] = {}

    def _reload(self) -> None:
        generation = (self._catalog.generation, self._quotas.prices_generation)
        if self._generation != generation:
            models = self._catalog.models()
            stored = self._quotas.prices
            self._terms_of = {m.name: (price_of(self._cfg, m.name, m, stored), m.max_tokens) for m in models}
            self._generation = generation

    def _terms(self, model: str) -> tuple[PriceConfig | None, int]:
        """The model's price and `max_tokens`; for a model not in the catalog (the router refuses it)
        the default price and the default's max_tokens."""
        self._reload()
        terms = self._terms_of.get(model)
        if terms is not None:
            return terms
        return price_of(self._cfg, model, stored=self._quotas.prices), _DEFAULT_MAX_TOKENS

    def _usage_name(self, model: str) -> str:
        """The name a request's usage is kept under: its model's, or UNKNOWN_MODEL for a name the catalog
        does not hold. A client names the model; were each name it made up a row of its own, a key
        could grow the usage table without bound with requests that are refused and cost nothing."""
        return model if self._catalog.get(model) is not None else UNKNOWN_MODEL

    @property
    def hierarchy(self) -> Hierarchy:
        """The organisations, teams and projects as last loaded: a project's model list lives here."""
        return self._quotas.hierarchy

    def listed(self, names: list[str], key: KeyRecord | None) -> list[str]:
        """What /v1/models shows key: the models it may call (gateway/access.py)."""
        return access.listed(names, key, self._quotas.hierarchy)

    async def _admit(self, key: KeyRecord, tokens: int, spend: float) -> Ticket:
        """The reservation for every scope of key's chain; ApiError when a scope refuses it."""
        try:
            return self._quotas.admit(key, tokens, spend)
        except Short as short:
            # Several gateways: this one's lease is short; wait for a claim rather than refuse.
            return await self._quotas.admit_leased(key, tokens, spend, short)

    async def count_refusals(self, call: Call, rest: Handler) -> web.StreamResponse:
        """The stage right after authentication: a request refused before it was admitted is in the
        usage too, under its key, its model and its status, as a request that held no place in any
        window and cost nothing.

        Every refusal alike, wherever it comes from: a model the key may not call (403), a body that
        is not the API's or asks too much (400), a limit or a budget (429). `llmgw usage` counts
        requests and errors from the stored usage, and a 403 was in neither while a 429 was. A request
        that names no model (no key or a bad one, a body that is not JSON) has nothing to be counted
        under, and is not.
        """
        try:
            return await rest(call)
        except ApiError as refusal:
            key = call.key
            # Once admitted, the request's own settlement records it, whatever its end.
            if key is not None and call.model and not call.count_usage:
                self._recorder.record(
                    key.id,
                    key.project_id,
                    self._usage_name(call.model),
                    refusal.status,
                    0,
                    0,
                    0.0,
                    0.0,
                    admitted=False,
                )
            raise

    async def __call__(self, call: Call, rest: Handler) -> web.StreamResponse:
        key = call.key
        if key is None:
            return await rest(call)
        model = call.model
        access.check(key, self._quotas.hierarchy, model)
        started = time.perf_counter()
        admitted_at = time.time()
        price, limit = self._terms(model)
        api = call.api
        payload = call.payload
        # Embeddings, rerank and token counts generate nothing: such a request costs its input alone,
        # and is sent as it came.
        asked = next((n for name in api.limit if (n := _asked(payload, name)) is not None), None)
        if api.limit:
            completion = (asked or limit) * (_choices(payload) if api.choices else 1)
        else:
            completion = limit if api.unbounded_text else 0
        if completion > limit:
            raise ApiError(
                400,
                f"this request asks for up to {completion} completion tokens; {model} allows at most {limit} "
                f"per request ({api.limit[-1]}{' times n' if api.choices else ''}): ask for fewer"
                + _how_to_ask_fewer(call.request, limit),
                param=api.limit[-1],
                code="max_tokens_too_large",
                refusal=("model", "max_tokens"),
            )
        # A token count costs nothing: it still counts as a request against rpm.
        prompt = api.reserved_prompt(payload, len(call.body)) if api.metered else 0
        ticket = await self._admit(key, prompt + completion, cost(price, prompt, completion))
        _ask_the_engine(call, limit if asked is None and api.limit else None)
        call.count_usage = True
        charged = False
        usage_name = self._usage_name(model)

        def done(status: int) -> None:
            nonlocal charged
            if charged:
                return
            charged = True
            used = _used(call, status, prompt, completion)
            spent = cost(price, *used)
            call.cost = spent
            self._quotas.settle(ticket, sum(used), spent)
            latency_ms = (time.perf_counter() - started) * 1000
            self._recorder.record(
                key.id, key.project_id, usage_name, status, *used, spent, latency_ms, at=admitted_at
            )

        call.done = done
        status = 500
        try:
            response = await rest(call)
            status = response.status
            return response
        except ApiError as err:
            status = err.status
            raise
        except asyncio.CancelledError:
            # The client went away (nginx's 499).
            status = 499
            raise
        finally:
            done(status)
            # done refers to call and call to done: a cycle only the garbage collector would free, with
            # the request, its body and its reply in it, on every request.
            call.done = None


def _how_to_ask_fewer(request: web.Request, limit: int) -> str:
    """For a client whose user cannot set max_tokens on the request, the setting that does."""
    # Claude Code asks for 32,000 whatever the model: its user never sees the request, only this.
    claude_code = request.headers.get("User-Agent", "").startswith("claude-cli")
    if claude_code or request.headers.get("x-app") == "cli":
        return f" (Claude Code: set CLAUDE_CODE_MAX_OUTPUT_TOKENS={limit})"
    return ""
