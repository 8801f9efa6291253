"""Which models a key may call: the one answer the routes, the listing and admission all ask.

One place, because only admission used to ask: a key made for one model was
refused every other model's chat but shown every model in /v1/models. Any
further restriction (a project's own list, say) belongs here, and every route
then obeys it.
"""

from __future__ import annotations

from llmgw.gateway.errors import ApiError
from llmgw.store.keys import KeyRecord


def may_call(key: KeyRecord | None, model: str) -> bool:
    """Whether a call with key may use model; a call without one (auth disabled) may use any."""
    if key is None:
        return True
    return key.models is None or model in key.models


def check(key: KeyRecord | None, model: str) -> None:
    """Refuse with 403, naming what the key may use, when key may not call model."""
    if may_call(key, model):
        return
    assert key is not None
    allowed = ", ".join(key.models or ()) or "none"
    raise ApiError(
        403,
        f"the API key {key.prefix}… ({key.name}) may not use the model '{model}' (it may use: {allowed})",
        code="model_not_allowed",
        param="model",
    )
