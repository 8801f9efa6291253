"""The admin API's vocabulary for tenancy: organisations, teams, projects, members, quotas, prices.

Built by tenancy/operations.py from the store; the admin API answers with them,
`llmgw orgs|teams|projects|quotas|prices` print them, and the OpenAPI
document's schemas come from them (adminapi/schema.py), as for adminapi/views.py.
"""

from __future__ import annotations

from typing import Any, Literal

import attrs

from llmgw.maxima import MAX_BUDGET, MAX_PER_MINUTE, MAX_PRICE_PER_1K

Period = Literal["day", "week", "month", "total"]
# Where a model's price comes from, first to last: `llmgw prices set`, the model's own definition,
# server.yaml's `pricing`, its `default_price`; "none" when nothing prices it.
PriceSource = Literal["set", "model", "pricing", "default", "none"]
UsageBy = Literal["org", "team", "project", "key", "model"]


def _from_0_to(most: int) -> dict[str, Any]:
    """What a request's number must be beyond its type, in the document (adminapi/schema.py)."""
    return {"schema": {"minimum": 0, "maximum": most}}


# A field of a change that may be left out, keeping what it was: the document must not require it.
_LEFT_OUT_KEEPS = {"required": False}
_NOT_BLANK = {"pattern": r"\S"}
# The shared schema of a scope name, defined with the others of NAMED in adminapi/schema.py (the admin
# API sits above tenancy, so the reference is written here, and the document's validation resolves it).
_SCOPE_NAME = {"$ref": "#/components/schemas/ScopeName"}


@attrs.frozen
class Org:
    id: int
    name: str


@attrs.frozen
class Team:
    id: int
    name: str
    org_id: int
    org: str


@attrs.frozen
class Project:
    id: int
    name: str
    team_id: int
    team: str
    org_id: int
    org: str
    models: list[str] | None = attrs.field(
        metadata={"doc": "The only models the project's keys may call; null: any model."}
    )


@attrs.frozen
class Member:
    """An account that belongs to a project: its keys count against the project."""

    id: int
    email: str
    status: str = attrs.field(metadata={"doc": "pending, active or disabled."})
    admin: bool
    project_id: int | None


@attrs.frozen
class Deleted:
    name: str = attrs.field(metadata={"doc": "How the deleted org, team or project was named."})
    deleted: bool


@attrs.frozen
class Quota:
    """A scope's limits and budget; null where the scope sets none (a scope above it may)."""

    scope: str = attrs.field(metadata={"doc": '"project:3": the kind and id.'})
    name: str = attrs.field(
        metadata={"doc": "The scope for a person: \"project 'web' (team 'core', org 'acme')\"."}
    )
    rpm: int | None
    tpm: int | None
    budget: float | None
    period: Period | None
    spent: float | None = attrs.field(
        metadata={"doc": "What the running gateway counts as spent this period; null without a budget."}
    )
    unpriced: str | None = attrs.field(
        default=None,
        metadata={
            "doc": "In the reply to setting a budget: that budgets never bind on the catalog's models with "
            "no price, naming them. Null otherwise."
        },
    )


@attrs.frozen
class QuotaChange:
    """The body of PUT /api/v1/quotas/{scope}: a field left out keeps what the scope had; null clears it."""

    rpm: int | None = attrs.field(metadata={**_from_0_to(MAX_PER_MINUTE), **_LEFT_OUT_KEEPS})
    tpm: int | None = attrs.field(metadata={**_from_0_to(MAX_PER_MINUTE), **_LEFT_OUT_KEEPS})
    budget: float | None = attrs.field(metadata={**_from_0_to(MAX_BUDGET), **_LEFT_OUT_KEEPS})
    period: Period = attrs.field(metadata=_LEFT_OUT_KEEPS)


@attrs.frozen
class Price:
    """What a model costs per 1,000 tokens, and which setting says so."""

    model: str
    prompt_per_1k: float | None
    completion_per_1k: float | None
    source: PriceSource


@attrs.frozen
class PriceChange:
    """The body of PUT /api/v1/prices/{model}."""

    prompt_per_1k: float = attrs.field(metadata=_from_0_to(MAX_PRICE_PER_1K))
    completion_per_1k: float = attrs.field(metadata=_from_0_to(MAX_PRICE_PER_1K))


@attrs.frozen
class NameChange:
    """The body of POST /api/v1/orgs (create) and PATCH to an item (rename)."""

    name: str = attrs.field(metadata={"schema": _SCOPE_NAME})
    parent: str = attrs.field(
        default="",
        metadata={
            "doc": "Not read: an organisation is in nothing, and a rename does not move.",
            "required": False,
        },
    )


@attrs.frozen
class NewChild:
    """The body of POST /api/v1/teams and /api/v1/projects: what it is called, and what it goes in."""

    name: str = attrs.field(metadata={"schema": _SCOPE_NAME})
    parent: str = attrs.field(
        metadata={"doc": "A team's organisation; a project's team (id or name).", "schema": _SCOPE_NAME}
    )


@attrs.frozen
class MemberChange:
    """The body of POST /api/v1/projects/{project}/members."""

    user: str = attrs.field(
        metadata={
            "doc": "The account's id or email.",
            "schema": {"type": ["string", "integer"], **_NOT_BLANK},
        },
    )


@attrs.frozen
class ModelsChange:
    """The body of PUT /api/v1/projects/{project}/models."""

    models: list[str] | None = attrs.field(
        metadata={
            "doc": "The only models allowed; null: any model.",
            "schema": {"items": {"type": "string", **_NOT_BLANK}},
        }
    )


@attrs.frozen
class UsageRow:
    """What one org, team, project, key or model used in the range asked for."""

    by: UsageBy
    id: str = attrs.field(
        metadata={
            "doc": "The org's, team's, project's or key's id, or the model's name; empty for usage "
            "of a project deleted since."
        }
    )
    name: str
    requests: int
    errors: int = attrs.field(metadata={"doc": "Requests answered with a status of 400 or more."})
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    cost: float


SHAPES: tuple[type, ...] = (
    Org,
    Team,
    Project,
    Member,
    Deleted,
    Quota,
    QuotaChange,
    Price,
    PriceChange,
    NameChange,
    NewChild,
    MemberChange,
    ModelsChange,
    UsageRow,
)
