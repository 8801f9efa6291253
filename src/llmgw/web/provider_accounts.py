"""What an identity provider's groups give a person here, applied at each sign-in through it.

OpenID Connect (oidc.py) and SAML (saml.py) each read who the person is and their groups from what
the provider sent; this module makes or finds the account and sets its administrator role and
project from the groups by the setting's `groups` mapping, so that a person taken out of a group
loses what it gave at their next sign-in.
"""

from __future__ import annotations

from typing import Literal

import attrs
import structlog

from llmgw.errors import LlmgwError
from llmgw.store.base import Store
from llmgw.store.scopes import Hierarchy, Scope, ScopeError, load_hierarchy
from llmgw.store.users import AccountError, User, create_user, get_user_by_email

log = structlog.get_logger(__name__)


class SignInRefused(LlmgwError):
    """A sign-in through a provider that cannot go on, in a sentence for the person signing in."""


class InNoMappedGroup(SignInRefused):
    """The person is in none of the mapped groups: refused, and what the groups gave is taken away."""


@attrs.frozen
class Mapping:
    """What a provider's groups give, from its setting (auth.oidc or auth.saml)."""

    setting: str
    groups: dict[str, str]
    new_users: Literal["active", "pending"]
    # What `llmgw users list` says made an account this provider made.
    source: str


@attrs.frozen
class Grants:
    """What a person's groups give them here."""

    is_admin: bool
    # The projects, teams and organisations the groups make the person a member of, in the order
    # of auth.oidc.groups.
    places: tuple[Scope, ...]
    groups: tuple[str, ...]


def grants(hierarchy: Hierarchy, mapping: Mapping, groups: tuple[str, ...]) -> Grants:
    """What the groups map to under the setting's groups; InNoMappedGroup when no group is mapped."""
    mapped = [(group, target) for group, target in mapping.groups.items() if group in groups]
    if not mapped:
        raise InNoMappedGroup(
            "you are in none of the groups this server lets in "
            f"({', '.join(sorted(mapping.groups)) or 'none set'}); "
            "ask an administrator to add you to one at the identity provider"
        )
    finders = {"project": hierarchy.project_id, "team": hierarchy.team_id, "org": hierarchy.org_id}
    places: list[Scope] = []
    for group, target in mapped:
        kind, _, name = target.partition(":")
        if kind not in finders:
            continue
        try:
            places.append(Scope(kind, finders[kind](name)))  # type: ignore[arg-type]
        except ScopeError as exc:
            raise SignInRefused(
                f"{mapping.setting}.groups gives {group!r} {target!r}, which this server does not have: {exc}"
            ) from None
    return Grants(is_admin=any(t == "admin" for _, t in mapped), places=tuple(places), groups=groups)


def project_in(hierarchy: Hierarchy, places: tuple[Scope, ...], current: int | None) -> int | None:
    """The project an account is a member of under the places its groups give.

    Its current project where that lies in one of them (an administrator may have put the person
    in one project of a mapped team), otherwise the oldest project of the first place that has one:
    a person in `team:NAME` is in a project of that team, so of the team, and of its organisation.
    None when no place has a project, or the groups give none.
    """

    def within(project_id: int, place: Scope) -> bool:
        return place in hierarchy.chain(project_id).scopes

    if current is not None and current in hierarchy.projects and any(within(current, p) for p in places):
        return current
    for place in places:
        inside = sorted(p for p in hierarchy.projects if within(p, place))
        if inside:
            return inside[0]
        log.warning(
            "the provider's groups give a membership with no project in it", place=hierarchy.name(place)
        )
    return None


async def _strip(store: Store, user: User, groups: tuple[str, ...]) -> None:
    """Take away what the provider's groups gave an account whose person is now in none of them."""
    async with store.transaction() as db:
        await db.execute(
            "UPDATE users SET is_admin = 0, project_id = NULL, provider_groups = ? WHERE id = ?",
            ("\n".join(groups), user.id),
        )
    log.info("sign-in refused: in no mapped group; role and project taken away", email=user.email)


async def sign_in(store: Store, mapping: Mapping, email: str, groups: tuple[str, ...]) -> User:
    """The account email names, made or brought up to date with what the person's groups give.

    A new account is active or pending by the mapping's new_users; an existing one (local or made
    by a provider before) keeps its status, and its administrator role and project follow the
    groups, so that a person taken out of a group loses what it gave at this sign-in (and one taken
    out of every mapped group, refused, loses all of it).
    """
    user = await get_user_by_email(store, email)
    hierarchy = await load_hierarchy(store)
    try:
        granted = grants(hierarchy, mapping, groups)
    except InNoMappedGroup:
        if user is not None:
            await _strip(store, user, groups)
        raise
    made = False
    if user is None:
        try:
            user = await create_user(store, email, None, status=mapping.new_users)
            made = True
        except AccountError as exc:
            if (user := await get_user_by_email(store, email)) is None:
                raise SignInRefused(str(exc)) from None
    project_id = project_in(hierarchy, granted.places, user.project_id)
    async with store.transaction() as db:
        await db.execute(
            "UPDATE users SET is_admin = ?, project_id = ?, provider_groups = ? WHERE id = ?",
            (int(granted.is_admin), project_id, "\n".join(granted.groups), user.id),
        )
        if made:
            # Made by the provider: `llmgw users list` says so (a local account it signs in stays local).
            await db.execute("UPDATE users SET source = ? WHERE id = ?", (mapping.source, user.id))
    log.info(
        "sign-in through a provider",
        via=mapping.source,
        email=email,
        groups=list(granted.groups),
        admin=granted.is_admin,
        project=project_id,
    )
    return attrs.evolve(
        user,
        is_admin=granted.is_admin,
        project_id=project_id,
        groups=granted.groups,
        source=mapping.source if made else user.source,
    )
