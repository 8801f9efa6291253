"""The admin API of agent upgrades: start a roll (control/upgrades.py), and see where it stands.

The control plane holds the roll; this projects it into the view `ctl upgrade` prints.
"""

from __future__ import annotations

import time

from aiohttp import web

from llmgw.adminapi import views
from llmgw.adminapi.replies import error, reply
from llmgw.adminapi.routes import Body, Reply, Route
from llmgw.bodies import MAX_ADMIN_BODY, BadJson, read_json
from llmgw.control.upgrades import Order, Roll, Step, UpgradeRefused, Upgrades
from llmgw.maxima import MAX_NODES_AT_ONCE, MAX_TRIAL_S, said

UPGRADES_KEY = web.AppKey("llmgw.admin.upgrades", Upgrades)

_ERROR = Reply("What went wrong, in a sentence.", views.Error)


def _upgrades(request: web.Request) -> Upgrades | web.Response:
    upgrades = request.config_dict.get(UPGRADES_KEY)
    if upgrades is None:
        return error(404, "this server does not upgrade agents")
    return upgrades


async def post_upgrade(request: web.Request) -> web.Response:
    upgrades = _upgrades(request)
    if isinstance(upgrades, web.Response):
        return upgrades
    if request.content_type != "application/json":
        return error(415, "send the upgrade as JSON, as `llmgw ctl upgrade` does")
    try:
        body = await read_json(request, MAX_ADMIN_BODY)
    except BadJson as exc:
        return error(exc.status, str(exc))
    problem = _problem(body)
    if problem is not None:
        return error(
            400, f"{problem}; send version and sha256 (and url or index_url), as `llmgw ctl upgrade` does"
        )
    order = views.CONVERTER.structure(body, views.UpgradeOrder)
    wanted = Order(
        version=order.version,
        url=order.url,
        sha256=order.sha256.strip().lower(),
        nodes=tuple(order.nodes),
        max_unavailable=order.max_unavailable,
        find_links=order.find_links,
        trial_s=order.trial_s,
        index_url=order.index_url,
    )
    try:
        roll = await upgrades.start(wanted, dry_run=order.dry_run)
    except UpgradeRefused as exc:
        return error(409, str(exc))
    return reply(roll_view(roll), 200 if order.dry_run else 202)


def roll_view(roll: Roll, now: float | None = None) -> views.Upgrade:
    """The roll as `ctl upgrade status` shows it: its seconds, and each node's, up to now while it runs."""
    at = time.time() if now is None else now
    return views.Upgrade(
        version=roll.order.version,
        state=roll.state,
        detail=roll.detail,
        dry_run=roll.dry_run,
        max_unavailable=roll.order.max_unavailable,
        seconds=_seconds(roll.started, roll.finished, at),
        nodes=[_node_view(step, at) for step in roll.steps],
    )


def _node_view(step: Step, now: float) -> views.UpgradeNode:
    took = _seconds(step.started, step.finished, now) if step.started is not None else None
    return views.UpgradeNode(
        node=step.node, from_version=step.from_version, state=step.state, detail=step.detail, seconds=took
    )


def _seconds(started: float, finished: float | None, now: float) -> float:
    # Wall-clock times, kept across a change of leader: a clock stepped back reads 0, not a negative.
    return round(max(0.0, (finished if finished is not None else now) - started), 1)


# What each field of UpgradeOrder must be: cattrs would read 5 as "5" and a string as a list of letters.
_KINDS: dict[str, type] = {
    "version": str,
    "url": str,
    "index_url": str,
    "sha256": str,
    "nodes": list,
    "max_unavailable": int,
    "find_links": str,
    "trial_s": int,
    "dry_run": bool,
}
_NEEDED = ("version", "sha256")


def _problem(body: object) -> str | None:
    """What is wrong with body as an UpgradeOrder, in a sentence; None when nothing is."""
    if not isinstance(body, dict):
        return "the body is not a JSON object"
    unknown = sorted(set(body) - set(_KINDS))
    if unknown:
        return f"the body has fields an upgrade does not take: {', '.join(unknown)}"
    for name, kind in _KINDS.items():
        value = body.get(name)
        if value is None and name not in _NEEDED and name not in body:
            continue
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            return f"{name} must be a {kind.__name__}"
    if any(not body[name] for name in _NEEDED):
        return "version and sha256 must not be empty"
    if not all(isinstance(n, str) for n in body.get("nodes", [])):
        return "nodes must be a list of node ids"
    # 10**20 seconds could not be sent down a node's stream (32 bits): a roll that died mid-way.
    for name, most in (("max_unavailable", MAX_NODES_AT_ONCE), ("trial_s", MAX_TRIAL_S)):
        if not 1 <= body.get(name, 1) <= most:
            return f"{name} is {body[name]}; it must be a whole number from 1 to {said(most)}"
    return None


async def get_upgrade(request: web.Request) -> web.Response:
    upgrades = _upgrades(request)
    if isinstance(upgrades, web.Response):
        return upgrades
    roll = await upgrades.last()
    if roll is None:
        return error(404, "no upgrade of the agents has run yet")
    return reply(roll_view(roll))


ROUTES: tuple[Route, ...] = (
    Route(
        method="POST",
        path="/api/v1/upgrades",
        handler=post_upgrade,
        operation="upgradeAgents",
        summary="Roll the agents to another release, max_unavailable nodes at a time, keeping their engines.",
        description="Each node fetches the wheel (from url, or the package index when url is empty), refuses "
        "it unless its sha256 is the one given, installs it "
        "beside the running release and restarts into it; the roll stops at the first node that refuses "
        "or goes back (docs/operations.md, Upgrading).",
        body=Body(views.UpgradeOrder),
        replies={
            200: Reply("The plan of a dry run.", views.Upgrade),
            202: Reply("The roll, started.", views.Upgrade),
            400: _ERROR,
            404: Reply("This server rolls no agents (an admin API without a control plane).", views.Error),
            409: Reply("A roll is under way, or this one cannot start: why.", views.Error),
            415: _ERROR,
        },
    ),
    Route(
        method="GET",
        path="/api/v1/upgrades",
        handler=get_upgrade,
        operation="upgradeStatus",
        summary="The roll under way, or the last one: each node's state and how long it took.",
        replies={
            200: Reply("The roll.", views.Upgrade),
            404: Reply("No roll has run on this store.", views.Error),
        },
    ),
)
