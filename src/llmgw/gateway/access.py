"""Which models a key may call: its own allow-list, within its project's.

One function answers it, for the admission stage (a request for any other
model is a 403) and for /v1/models (which lists only what the key may call),
so that a listing never offers a model a request would be refused.
"""

from __future__ import annotations

from collections.abc import Iterable

from llmgw.gateway.errors import ApiError
from llmgw.store.keys import KeyRecord
from llmgw.store.scopes import Hierarchy, Scope


def allowed_models(key: KeyRecord, hierarchy: Hierarchy) -> frozenset[str] | None:
    """The models key may call; None: any. Both the key's list and its project's apply."""
    project = hierarchy.projects.get(key.project_id)
    project_models = project.models if project is not None else None
    if key.models is None and project_models is None:
        return None
    if key.models is None:
        return frozenset(project_models or ())
    if project_models is None:
        return frozenset(key.models)
    return frozenset(key.models) & frozenset(project_models)


def may_call(key: KeyRecord, hierarchy: Hierarchy, model: str) -> bool:
    allowed = allowed_models(key, hierarchy)
    return allowed is None or model in allowed


def listed(names: Iterable[str], key: KeyRecord | None, hierarchy: Hierarchy) -> list[str]:
    """The model names a key may call, in catalog order; every one without a key (auth disabled)."""
    if key is None:
        return list(names)
    allowed = allowed_models(key, hierarchy)
    return [name for name in names if allowed is None or name in allowed]


def check(key: KeyRecord, hierarchy: Hierarchy, model: str) -> None:
    """Raise the 403 that says which list keeps key from model, and what it may use."""
    if may_call(key, hierarchy, model):
        return
    project = hierarchy.projects.get(key.project_id)
    kind = "key"
    if key.models is not None and model not in key.models:
        allowed = ", ".join(sorted(allowed_models(key, hierarchy) or ())) or "none"
        why = (
            f"the API key {key.prefix}… ({key.name}) may not use the model '{model}' (it may use: {allowed})"
        )
    else:
        assert project is not None and project.models is not None
        kind = "project"
        own = ", ".join(project.models) or "none"
        why = (
            f"the API key {key.prefix}… ({key.name}) may not use the model '{model}': "
            f"{hierarchy.name(Scope('project', project.id))} allows only {own}"
        )
    # Tagged for the metrics' admission refusals: which kind of scope's list refused it.
    raise ApiError(403, why, code="model_not_allowed", param="model", refusal=(kind, "model_not_allowed"))
