"""The admin API of agent upgrades: start a roll (control/upgrades.py), and see where it stands."""

from __future__ import annotations

import cattrs
from aiohttp import web

from llmgw.adminapi import views
from llmgw.adminapi.replies import error, reply
from llmgw.adminapi.routes import Body, Reply, Route
from llmgw.bodies import MAX_ADMIN_BODY, BadJson, read_json
from llmgw.control.upgrades import Order, UpgradeRefused, Upgrades

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
        order = views.CONVERTER.structure(body, views.UpgradeOrder)
    except BadJson as exc:
        return error(exc.status, str(exc))
    except (ValueError, TypeError, cattrs.BaseValidationError):
        return error(400, "the body is not an upgrade: it needs version, url and sha256")
    if not (order.version and order.url and order.sha256):
        return error(400, "an upgrade needs the version, the wheel's url and its sha256")
    wanted = Order(
        version=order.version,
        url=order.url,
        sha256=order.sha256.strip().lower(),
        nodes=tuple(order.nodes),
        max_unavailable=order.max_unavailable,
        find_links=order.find_links,
        trial_s=order.trial_s,
    )
    try:
        view = upgrades.start(wanted, dry_run=order.dry_run)
    except UpgradeRefused as exc:
        return error(409, str(exc))
    return reply(view, 200 if order.dry_run else 202)


async def get_upgrade(request: web.Request) -> web.Response:
    upgrades = _upgrades(request)
    if isinstance(upgrades, web.Response):
        return upgrades
    view = upgrades.view()
    if view is None:
        return error(404, "no upgrade has run since this control plane started")
    return reply(view)


ROUTES: tuple[Route, ...] = (
    Route(
        method="POST",
        path="/api/v1/upgrades",
        handler=post_upgrade,
        operation="upgradeAgents",
        summary="Roll the agents to another release, max_unavailable nodes at a time, keeping their engines.",
        description="Each node fetches the wheel, refuses it unless its sha256 is the one given, installs it "
        "beside the running release and restarts into it; the roll stops at the first node that refuses "
        "or goes back (docs/operations.md, Upgrading).",
        body=Body(views.UpgradeOrder),
        replies={
            200: Reply("The plan of a dry run.", views.Upgrade),
            202: Reply("The roll, started.", views.Upgrade),
            400: _ERROR,
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
        replies={200: Reply("The roll.", views.Upgrade), 404: _ERROR},
    ),
)
