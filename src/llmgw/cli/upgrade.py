"""`llmgw ctl upgrade`: roll the agents to another release, and `upgrade status` to see where it stands."""

from __future__ import annotations

import hashlib
import time
from pathlib import Path

import click

from llmgw.adminapi import views
from llmgw.cli.adminclient import Target, fail, get_view, json_option, print_json, read, request, target
from llmgw.cli.exit import EXIT_ERROR, EXIT_USAGE
from llmgw.cli.params import Bounded
from llmgw.cli.table import echo_table
from llmgw.maxima import MAX_NODES_AT_ONCE, MAX_TRIAL_S, said

_ENDED = ("done", "stopped", "planned")


@click.group(invoke_without_command=True)
@click.option("--to", "version", metavar="VERSION", help="The llmgw version to run: 0.12.0.")
@click.option(
    "--wheel",
    metavar="URL|PATH",
    help="The release's wheel: the mirror's http(s) URL, or a path that is the same on every node. "
    "Without it, each node fetches llmgw VERSION from its package index.",
)
@click.option(
    "--sha256",
    metavar="HEX",
    help="The wheel's digest: every node refuses any other. Read here when --wheel is a file here.",
)
@click.option(
    "--index-url",
    default="",
    metavar="URL",
    help="Without --wheel: the package index each node fetches the release and its new dependencies "
    "from; default the one its pip is configured with.",
)
@click.option(
    "--find-links",
    default="",
    metavar="URL|DIR",
    help="A wheelhouse for dependencies the running agents do not have (a bundle's, the mirror's).",
)
@click.option(
    "--nodes", default="", metavar="N1,N2", help="Only these nodes, in this order; default every node."
)
@click.option(
    "--max-unavailable",
    default=1,
    show_default=True,
    type=Bounded("--max-unavailable", MAX_NODES_AT_ONCE, whole=True, least=1),
    help=f"How many nodes restart at once, 1 to {said(MAX_NODES_AT_ONCE)}.",
)
@click.option(
    "--trial-s",
    default=60,
    show_default=True,
    type=Bounded("--trial-s", MAX_TRIAL_S, whole=True, least=1),
    help="Seconds a new agent has to register before it goes back to the release it left, 1 to "
    f"{said(MAX_TRIAL_S)}.",
)
@click.option(
    "--dry-run", is_flag=True, help="Say which nodes would be upgraded, in which order, and do nothing."
)
@click.option("--wait/--no-wait", default=True, show_default=True, help="Follow the roll to its end.")
@json_option
@click.pass_context
def upgrade(
    ctx: click.Context,
    version: str | None,
    wheel: str | None,
    sha256: str | None,
    index_url: str,
    find_links: str,
    nodes: str,
    max_unavailable: int,
    trial_s: int,
    dry_run: bool,
    wait: bool,
    as_json: bool,
) -> None:
    """Roll the agents to another release, one node at a time, keeping their engines running.

    Each node fetches the wheel (--wheel, or llmgw VERSION from its package index), refuses it
    unless its sha256 matches, installs it beside the running release and restarts into it; a
    node that cannot goes back on its own, and the roll stops there. `llmgw ctl upgrade status`
    shows where it stands.
    """
    if ctx.invoked_subcommand is not None:
        return
    if not version:
        fail("say which release: --to VERSION, and --wheel URL|PATH or --sha256 HEX", EXIT_USAGE)
    if wheel and index_url:
        fail(
            "--index-url is where the release comes from without --wheel: give one or the other "
            "(dependencies a wheel needs anew come from --find-links)",
            EXIT_USAGE,
        )
    if not wheel and not sha256:
        # The control plane must hold the digest: a node takes from its index whatever it is served.
        fail(
            f"give --sha256 of llmgw {version}'s wheel, as the registry lists it "
            f"(pip download llmgw=={version} --no-deps; sha256sum)",
            EXIT_USAGE,
        )
    there = target(ctx, as_json)
    order = {
        "version": version,
        "url": wheel or "",
        "index_url": index_url,
        "sha256": sha256 or _digest_here(wheel or ""),
        "find_links": find_links,
        "nodes": [n.strip() for n in nodes.split(",") if n.strip()],
        "max_unavailable": max_unavailable,
        "trial_s": trial_s,
        "dry_run": dry_run,
    }
    data = request(there, "POST", "/api/v1/upgrades", order)
    roll = read(data, views.Upgrade)
    if wait and not dry_run:
        roll = _follow(there, roll, quiet=there.as_json)
        data = request(there, "GET", "/api/v1/upgrades")
    if there.as_json:
        print_json(data)
    else:
        _print(roll)
    if roll.state == "stopped":
        fail(f"the upgrade to {roll.version} {roll.detail}", EXIT_ERROR)


@upgrade.command("status")
@json_option
@click.pass_context
def upgrade_status(ctx: click.Context, as_json: bool) -> None:
    """The roll under way, or the last one: each node's state, and how long it took."""
    if (roll := get_view(ctx, as_json, "/api/v1/upgrades", views.Upgrade)) is not None:
        _print(roll)


def _digest_here(wheel: str) -> str:
    path = Path(wheel.removeprefix("file://"))
    if wheel.startswith(("http://", "https://")) or not path.is_file():
        fail(
            f"give the wheel's digest with --sha256: {wheel} is not a file on this machine to read it from",
            EXIT_USAGE,
        )
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    click.echo(f"{path.name}: sha256 {digest.hexdigest()}", err=True)
    return digest.hexdigest()


def _follow(there: Target, roll: views.Upgrade, *, quiet: bool) -> views.Upgrade:
    """Poll the roll until it ends, a line on stderr each time a node's state changes."""
    said: dict[str, str] = {}
    while True:
        for node in roll.nodes:
            line = f"{node.node}: {node.state}" + (f" ({node.detail})" if node.detail else "")
            if said.get(node.node) != line and not quiet:
                click.echo(line, err=True)
            said[node.node] = line
        if roll.state in _ENDED:
            return roll
        time.sleep(1)
        roll = read(request(there, "GET", "/api/v1/upgrades"), views.Upgrade)


def _print(roll: views.Upgrade) -> None:
    head = f"upgrade to {roll.version}: {roll.state}" + (" (dry run)" if roll.dry_run else "")
    click.echo(f"{head}, {roll.seconds:g} s, {roll.max_unavailable} node(s) at a time")
    rows = [
        [
            n.node,
            n.from_version or "unknown",
            n.state,
            f"{n.seconds:g} s" if n.seconds is not None else "—",
            n.detail,
        ]
        for n in roll.nodes
    ]
    echo_table(["NODE", "FROM", "STATE", "TOOK", "DETAIL"], rows)
    if roll.detail:
        click.echo(roll.detail)
