"""The admission stage: model allow-list, rate limits and budgets before routing; settlement and usage after.

Between read_request and route. Tokens are reserved at admission (an
estimate of the prompt from its size, plus max_tokens, capped) and settled
to the usage the engine reports once the reply has been sent; the request's
usage is recorded in memory for the writer.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence

from aiohttp import web

from llmgw.catalog import Catalog
from llmgw.config import ModelConfig, PriceConfig, ServerConfig
from llmgw.gateway.errors import ApiError
from llmgw.gateway.pipeline import Call, Handler
from llmgw.gateway.quotas import Quotas
from llmgw.gateway.usage import UsageRecorder
from llmgw.store.quotas import Budget

# A request that names no max_tokens is assumed to want this many: enough that
# tpm bites, not so many that one request fills a small tpm on its own.
_DEFAULT_COMPLETION = 1024
# No reservation above this, whatever max_tokens says (some clients send the
# model's whole context length); settlement corrects it afterwards.
_RESERVE_CAP = 32768
# JSON of chat messages runs to about four bytes a token; an overestimate is
# corrected at settlement, an underestimate would let a burst through.
_BYTES_PER_TOKEN = 4


def price_of(cfg: ServerConfig, model: str, definition: ModelConfig | None = None) -> PriceConfig | None:
    """The model's price: its definition's `pricing`, its `pricing` entry, else `default_price` unless
    that is zero; None: no price."""
    if definition is not None and definition.pricing is not None:
        return definition.pricing
    price = cfg.pricing.get(model)
    if price is not None:
        return price
    default = cfg.default_price
    if default.prompt_per_1k or default.completion_per_1k:
        return default
    return None


def cost(price: PriceConfig | None, prompt_tokens: int, completion_tokens: int) -> float:
    if price is None:
        return 0.0
    return (prompt_tokens * price.prompt_per_1k + completion_tokens * price.completion_per_1k) / 1000


def budget_warnings(cfg: ServerConfig, budgets: Sequence[Budget], models: Sequence[ModelConfig]) -> list[str]:
    """A sentence for every model of models (the live catalog's) no price applies to, when budgets are set.

    Logged at start; the quotas page shows them too.
    """
    if not budgets:
        return []
    return [
        f"budgets are set but no price applies to {model.name}: they never bind"
        for model in models
        if price_of(cfg, model.name, model) is None
    ]


def _completion_tokens(payload: dict[str, object]) -> int:
    for name in ("max_completion_tokens", "max_tokens"):
        value = payload.get(name)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return _DEFAULT_COMPLETION


class Admission:
    """The pipeline stage; a call without a key (auth disabled) passes untouched."""

    def __init__(self, cfg: ServerConfig, catalog: Catalog, quotas: Quotas, recorder: UsageRecorder) -> None:
        self._cfg = cfg
        self._quotas = quotas
        self._recorder = recorder
        # The live catalog: a model added with ctl brings its own price.
        self._catalog = catalog
        self._generation = -1
        self._prices: dict[str, PriceConfig | None] = {}

    def _price(self, model: str) -> PriceConfig | None:
        if self._generation != self._catalog.generation:
            self._prices = {m.name: price_of(self._cfg, m.name, m) for m in self._catalog.models()}
            self._generation = self._catalog.generation
        return self._prices[model] if model in self._prices else price_of(self._cfg, model)

    async def __call__(self, call: Call, rest: Handler) -> web.StreamResponse:
        key = call.key
        if key is None:
            return await rest(call)
        model = call.model
        if key.models is not None and model not in key.models:
            allowed = ", ".join(key.models) or "none"
            raise ApiError(
                403,
                f"the API key {key.prefix}… ({key.name}) may not use the model '{model}' "
                f"(it may use: {allowed})",
                code="model_not_allowed",
                param="model",
            )
        started = time.perf_counter()
        prompt = len(call.body) // _BYTES_PER_TOKEN
        completion = _completion_tokens(call.payload)
        price = self._price(model)
        try:
            ticket = self._quotas.admit(
                key, min(prompt + completion, _RESERVE_CAP), cost(price, prompt, completion)
            )
        except ApiError as refusal:
            self._recorder.record(key.id, key.project_id, model, refusal.status, 0, 0, 0.0, 0.0)
            raise
        call.count_usage = True
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
            if call.usage is not None:
                prompt, completion = call.usage
            elif status >= 400 and status != 499:
                prompt = completion = 0
            # else: a reply that reports no usage (a stream without
            # stream_options.include_usage, or one the client left early) is
            # charged what was reserved, so that leaving early saves nothing.
            spent = cost(price, prompt, completion)
            self._quotas.settle(ticket, prompt + completion, spent)
            self._recorder.record(
                key.id,
                key.project_id,
                model,
                status,
                prompt,
                completion,
                spent,
                (time.perf_counter() - started) * 1000,
            )
