"""`llmgw ctl`: the cluster from a shell, through the admin API.

By default it talks to the admin listener of the server it runs on (read from
server.yaml's admin_listen), which needs no token: being on the machine is the
credential. From elsewhere, `--server https://gateway.example/admin --token T`
reaches the same API on the client port with an admin token.

Exit codes (scripts may rely on them): 0 done; 1 the server answered with an
error (a node that is not connected or did not answer, for instance); 2 wrong
usage; 3 the server cannot be reached; 4 no such node, model or log source;
5 the server refused the token; 78 server.yaml cannot be read.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

import attrs
import cattrs
import click

from llmgw.adminapi import views
from llmgw.adminapi.auth import hash_token
from llmgw.adminapi.auth import new_token as make_token
from llmgw.adminapi.present import (
    DASH,
    ago,
    control_plane_line,
    failure_line,
    hidden_models,
    model_note,
    node_row,
    refused_line,
    replica_state,
    unattended_note,
)
from llmgw.cli.adminclient import (
    DEFAULT_CONFIG,
    json_option,
)
from llmgw.cli.adminclient import Target as _Target
from llmgw.cli.adminclient import error_text as _error_text
from llmgw.cli.adminclient import exchange as _exchange
from llmgw.cli.adminclient import exit_code as _exit_code
from llmgw.cli.adminclient import fail as _fail
from llmgw.cli.adminclient import get_view as _get_view
from llmgw.cli.adminclient import print_json as _print_json
from llmgw.cli.adminclient import read as _read
from llmgw.cli.adminclient import request as _request
from llmgw.cli.adminclient import target as _target
from llmgw.cli.bench import bench
from llmgw.cli.engine_check import engine_check
from llmgw.cli.exit import (
    EXIT_ERROR,
    EXIT_USAGE,
)
from llmgw.cli.table import echo_table
from llmgw.cli.upgrade import upgrade
from llmgw.control.nodelogs import MAX_LINES
from llmgw.download import human_bytes
from llmgw.gateway.endpoints import ENDPOINT_ENGINE
from llmgw.mirror.admin import Fetch
from llmgw.mirror.fetch import FetchedModel
from llmgw.names import url_segment


def _cells(values: list[str] | None) -> str:
    return ",".join(values) if values else DASH


# How long `model add` waits for the server, which hashes a local source's every byte first.
_MODEL_ADD_S = 3600.0


@click.group()
@click.option(
    "--config",
    "config_path",
    type=click.Path(path_type=Path, dir_okay=False),
    default=DEFAULT_CONFIG,
    show_default=True,
    help="The server's configuration: ctl talks to its admin listener (admin_listen).",
)
@click.option(
    "--server",
    envvar="LLMGW_SERVER",
    help="The admin API's base URL instead: http://127.0.0.1:9090, or https://HOST/admin on the client port.",
)
@click.option(
    "--token",
    envvar="LLMGW_ADMIN_TOKEN",
    help="An admin token (its sha256 in server.yaml's admin_tokens); needed for /admin on the client port.",
)
@json_option
@click.pass_context
def ctl(ctx: click.Context, config_path: Path, server: str | None, token: str | None, as_json: bool) -> None:
    """The cluster from a shell: nodes, models, replicas, placement and a node's logs.

    Exit codes: 0 done, 1 the server answered with an error, 2 wrong usage, 3 the server
    cannot be reached, 4 no such node, model or source, 5 the token was refused,
    78 server.yaml cannot be read.
    """
    # These run on this machine alone and need no server.yaml.
    if ctx.invoked_subcommand in ("new-token", "engine-check"):
        return
    url = server.rstrip("/") if server else ""
    ctx.obj = _Target(url=url, token=token, as_json=as_json, config_path=config_path)


@ctl.command()
@json_option
@click.pass_context
def status(ctx: click.Context, as_json: bool) -> None:
    """How many nodes, models and replicas, and in which state."""
    view = _get_view(ctx, as_json, "/api/v1/status", views.Status)
    if view is None:
        return
    counts = attrs.asdict(view.nodes)
    states = ", ".join(f"{n} {s}" for s, n in counts.items() if s != "total" and n)
    click.echo(f"llmgw     {view.version}")
    click.echo(f"nodes     {view.nodes.total}" + (f" ({states})" if states else ""))
    click.echo(f"models    {view.models.serving} of {view.models.total} serving")
    click.echo(f"replicas  {view.replicas.ready} of {view.replicas.total} ready{unattended_note(view)}")
    if view.control_plane is not None:
        click.echo(f"control   {control_plane_line(view.control_plane)}")
    # A node that never joined is often one refused at the door: its own log says why, and so does this.
    if view.refused:
        click.echo("")
        for refused in view.refused:
            click.echo(refused_line(refused))


@ctl.command()
@json_option
@click.pass_context
def nodes(ctx: click.Context, as_json: bool) -> None:
    """Every node: state, GPUs, memory, disk, engines, replicas; then what is wrong with each."""
    target = _target(ctx, as_json)
    data = _request(target, "GET", "/api/v1/nodes")
    if target.as_json:
        _print_json(data)
        return
    if not data:
        click.echo("no node has registered yet", err=True)
        return
    rows = [node_row(view) for view in _read(data, list[views.Node])]
    echo_table(
        [
            "NODE",
            "STATE",
            "VERSION",
            "GPUS FREE",
            "RAM FREE",
            "DISK FREE",
            "ENGINES",
            "CLASSES",
            "MODELS",
            "REPLICAS",
            "LAST SEEN",
        ],
        [
            [
                r.id,
                r.state,
                r.version,
                r.gpus,
                r.ram,
                r.disk,
                r.engines,
                r.classes,
                r.models,
                str(r.replicas),
                r.last_seen,
            ]
            for r in rows
        ],
    )
    # Beneath the table, what keeps a node from taking work: a person scanning for why a model
    # is not placed reads these first.
    notes = [f"{r.id}: {text}" for r in rows for _, text in r.notes]
    if notes:
        click.echo("")
        for note in notes:
            click.echo(note)


def _apis(model: views.Model) -> str:
    """The APIs a model serves: its engines' own, then those the gateway translates, marked so."""
    return _cells([*model.native_apis, *(f"{name} (translated)" for name in model.translated_apis)])


@ctl.command()
@json_option
@click.pass_context
def models(ctx: click.Context, as_json: bool) -> None:
    """Every catalog model: replicas ready of wanted, and why it serves nothing when it does not."""
    target = _target(ctx, as_json)
    data = _request(target, "GET", "/api/v1/models")
    if target.as_json:
        _print_json(data)
        return
    if not data:
        click.echo("the catalog is empty: add models under `models:` in server.yaml", err=True)
        return
    listed = _read(data, list[views.Model])
    echo_table(
        ["MODEL", "READY", "ENGINES", "APIS", "WHY NOT READY"],
        [[m.name, f"{m.ready}/{m.wanted}", _cells(m.engines), _apis(m), model_note(m)] for m in listed],
    )
    # Beneath the table, as `ctl nodes` puts its notes: a budget that never binds is no error
    # anywhere else an operator looks; an on-demand model's scale and why it runs what it runs.
    notes = [f"{m.name}: {m.scale.words()}" for m in listed if m.scale is not None]
    notes += [f"{m.name}: {m.unpriced}" for m in listed if m.unpriced]
    if notes:
        click.echo("")
        for note in notes:
            click.echo(note)


@ctl.command()
@click.option("--model", help="Only this model's replicas.")
@click.option(
    "--all",
    "everything",
    is_flag=True,
    help="Also the replicas that failed lately, with why (the last few per model and node).",
)
@json_option
@click.pass_context
def replicas(ctx: click.Context, model: str | None, everything: bool, as_json: bool) -> None:
    """Every replica: its model, node, state and endpoint (or why not ready); then the models with none."""
    target = _target(ctx, as_json)
    query = urlencode({k: v for k, v in (("model", model), ("all", "1" if everything else "")) if v})
    data = _request(target, "GET", "/api/v1/replicas" + (f"?{query}" if query else ""))
    if target.as_json:
        _print_json(data)
        return
    listed = _read(data, list[views.Replica])
    models = [
        m
        for m in _read(_request(target, "GET", "/api/v1/models"), list[views.Model])
        if model is None or m.name == model
    ]
    hidden = hidden_models(models, {r.model for r in listed}, everything)
    if not listed and not hidden:
        click.echo("no replica yet", err=True)
        return
    if listed:
        echo_table(
            ["REPLICA", "MODEL", "NODE", "STATE", "SINCE", "ENDPOINT OR DETAIL"],
            [
                [r.shard_id, r.model, r.node, replica_state(r), ago(r.since_s), r.endpoint or r.detail]
                for r in listed
            ],
        )
    # Beneath the table, or alone: a model failing over and over has no replica between its tries.
    if hidden:
        click.echo(f"\n{hidden}" if listed else hidden)


@ctl.command()
@click.argument("replica")
@json_option
@click.pass_context
def metrics(ctx: click.Context, replica: str, as_json: bool) -> None:
    """REPLICA's engine's own metrics (its /metrics page), read now: one sample a line."""
    got = _get_view(ctx, as_json, f"/api/v1/replicas/{url_segment(replica)}/metrics", views.ReplicaMetrics)
    if got is None:
        return
    for name, value in got.metrics.items():
        click.echo(f"{name} {value:g}")


@ctl.command()
@click.argument("model")
@json_option
@click.pass_context
def explain(ctx: click.Context, model: str, as_json: bool) -> None:
    """Per node, whether MODEL's next replica could go there, and why not."""
    path = f"/api/v1/explain-placement?model={quote(model, safe='')}"
    placement = _get_view(ctx, as_json, path, views.Placement)
    if placement is None:
        return
    if not placement.candidates:
        click.echo("no node has registered yet", err=True)
    else:
        echo_table(
            ["PROFILE", "NODE", "CANDIDATE", "WHY"],
            [[c.profile, c.node, "yes" if c.candidate else "no", c.reason] for c in placement.candidates],
        )
    if placement.why_not_ready:
        click.echo(f"\n{placement.why_not_ready}")
    if placement.scale is not None:
        click.echo(f"\nscale: {placement.scale.words()}")
    if placement.failures:
        click.echo("\nfailed lately:")
        for failure in placement.failures:
            click.echo(f"  {failure_line(failure)}")


@ctl.command()
@click.argument("node")
@click.option(
    "--source", default="agent", show_default=True, help='"agent", or a shard id for its engine\'s output.'
)
@click.option(
    "-n",
    "--lines",
    type=click.IntRange(1, MAX_LINES),
    default=200,
    show_default=True,
    help="How many of the newest lines.",
)
@json_option
@click.pass_context
def logs(ctx: click.Context, node: str, source: str, lines: int, as_json: bool) -> None:
    """The newest lines of NODE's agent log, or of an engine on it; then, on stderr, its other logs.

    They come over the node's own stream to the control plane: no ssh, no jump host, no root.
    """
    target = _target(ctx, as_json)
    status, data = _exchange(
        target, "GET", f"/api/v1/nodes/{url_segment(node)}/logs?source={quote(source, safe='')}&lines={lines}"
    )
    if status >= 400 and not (isinstance(data, dict) and "lines" in data):
        _fail(_error_text(data, status), _exit_code(status))
    if target.as_json:
        _print_json(data)
    else:
        log = _read(data, views.Logs)
        for line in log.lines:
            click.echo(line)
        # Where else to look: a shard id is the one thing a person cannot guess.
        others = [s for s in log.sources if s != log.source]
        if log.error:
            click.echo(f"llmgw ctl: {log.error}", err=True)
        click.echo(f"-- {log.source} on {log.node}; other sources: {', '.join(others) or 'none'}", err=True)
    if status >= 400:
        sys.exit(_exit_code(status))


@ctl.group()
def node() -> None:
    """Take a node out of placement (cordon, drain) or put it back (uncordon)."""


_STATES = {
    "cordon": ("cordoned", "no new replica goes there; what runs there keeps running"),
    "drain": (
        "draining",
        "no new request or replica goes there; its replicas finish what is in flight, "
        "then stop and are replaced elsewhere",
    ),
    "uncordon": ("ready", "replicas may be placed there again"),
}


def _state_command(verb: str) -> None:
    state, meaning = _STATES[verb]

    @node.command(verb, help=f"Set NODE's state to {state}: {meaning}.")
    @click.argument("node_id", metavar="NODE")
    @json_option
    @click.pass_context
    def command(ctx: click.Context, node_id: str, as_json: bool) -> None:
        target = _target(ctx, as_json)
        data = _request(target, "POST", f"/api/v1/nodes/{url_segment(node_id)}/state", {"state": state})
        if target.as_json:
            _print_json(data)
            return
        changed = _read(data, views.Node)
        click.echo(f"{changed.id} is {changed.admin_state}: {meaning}")


for _verb in _STATES:
    _state_command(_verb)


@ctl.group()
def model() -> None:
    """Add models to the catalog while the server runs, or remove them; server.yaml's stay as declared."""


@model.command("add")
@click.option(
    "-f",
    "--file",
    "path",
    required=True,
    type=click.Path(exists=True, dir_okay=False, allow_dash=True, path_type=Path),
    help="The model's definition, as one entry under `models:` in server.yaml; - reads stdin.",
)
@json_option
@click.pass_context
def model_add(ctx: click.Context, path: Path, as_json: bool) -> None:
    """Add the model FILE defines, or replace the one of that name added before; kept over restarts."""
    target = _target(ctx, as_json)
    if str(path) == "-":
        text, name = sys.stdin.read(), "<stdin>"
    else:
        try:
            text, name = path.read_text(encoding="utf-8"), str(path)
        except (OSError, UnicodeDecodeError) as exc:
            _fail(f"{path} cannot be read: {exc}", EXIT_USAGE)
    # A source on the server's disk is hashed before the answer: minutes for a model of tens of GB.
    status, data = _exchange(
        target, "POST", f"/api/v1/models?file={quote(name, safe='')}", yaml_text=text, timeout_s=_MODEL_ADD_S
    )
    if status >= 400:
        _fail(_error_text(data, status), _exit_code(status))
    if target.as_json:
        _print_json(data)
        return
    added = _read(data, views.Model)
    verb = "replaced" if status == 200 else "added"
    if added.engines == [ENDPOINT_ENGINE]:
        click.echo(f"{verb} {added.name}: served by {added.wanted} endpoint(s), checked from now on")
        return
    click.echo(f"{verb} {added.name}: {added.wanted} replica(s) wanted, placed from now on")
    if added.unpriced:
        click.echo(f"warning: {added.unpriced}", err=True)


@model.command("remove")
@click.argument("name")
@json_option
@click.pass_context
def model_remove(ctx: click.Context, name: str, as_json: bool) -> None:
    """Remove NAME, a model added with `model add`; its replicas are stopped."""
    target = _target(ctx, as_json)
    data = _request(target, "DELETE", f"/api/v1/models/{url_segment(name)}")
    if target.as_json:
        _print_json(data)
        return
    click.echo(f"removed {_read(data, views.Removed).name}: its replicas are being stopped")


@ctl.group()
def weights() -> None:
    """The model weights on the nodes' disks."""


@weights.command("collect")
@json_option
@click.pass_context
def weights_collect(ctx: click.Context, as_json: bool) -> None:
    """Ask every node to remove the weights no catalog model uses; weights an engine has open stay."""
    target = _target(ctx, as_json)
    data = _request(target, "POST", "/api/v1/weights/collect")
    if target.as_json:
        _print_json(data)
        return
    for entry in _read(data, views.Collected).nodes:
        if entry.error:
            click.echo(f"{entry.node}: {entry.error}")
            continue
        click.echo(f"{entry.node}: removing {len(entry.removing)}, keeping {len(entry.kept)}")
        for source in entry.removing:
            click.echo(f"  removing {source}")
        for kept in entry.kept:
            click.echo(f"  keeping {kept}")


@ctl.group()
def mirror() -> None:
    """The model mirror, through the server: the models it holds, fetching and deleting them."""


@mirror.command("list")
@json_option
@click.pass_context
def mirror_list(ctx: click.Context, as_json: bool) -> None:
    """The models on the mirror, with their commits, files and sizes; then the fetches running."""
    target = _target(ctx, as_json)
    data = _request(target, "GET", "/api/v1/mirror/models")
    running = _request(target, "GET", "/api/v1/mirror/fetches")
    if target.as_json:
        _print_json({**data, **running})
        return
    models = _mirror_read(data.get("models"), list[FetchedModel])
    rows = [
        [f"{m.repo}@{m.commit[:12]}", m.revision, str(len(m.files)), human_bytes(m.size, None)]
        for m in models
    ]
    echo_table(["MODEL", "FETCHED AS", "FILES", "SIZE"], rows)
    for fetch in _mirror_read(running.get("fetches"), list[Fetch]):
        if fetch.state == "running":
            click.echo(
                f"fetching {fetch.model}: " + (fetch.progress.describe() if fetch.progress else "starting")
            )


@mirror.command("fetch")
@click.argument("ref", metavar="REPO[@REVISION]")
@click.option(
    "--include",
    multiple=True,
    metavar="GLOB",
    help="Fetch only the files whose path matches GLOB (such as '*.gguf'); repeat it for several.",
)
@click.option("--wait", is_flag=True, help="Wait for the fetch to finish, printing its progress.")
@json_option
@click.pass_context
def mirror_fetch(ctx: click.Context, ref: str, include: tuple[str, ...], wait: bool, as_json: bool) -> None:
    """Have the mirror fetch REPO at REVISION (default main) from its hub, pinned to the commit."""
    target = _target(ctx, as_json)
    data = _request(target, "POST", "/api/v1/mirror/fetches", {"model": ref, "include": list(include)})
    fetch = _mirror_read(data, Fetch)
    if not wait:
        if target.as_json:
            _print_json(data)
        else:
            click.echo(f"fetch {fetch.id} started: {fetch.model}; `llmgw ctl mirror list` shows its progress")
        return
    said = ""
    while fetch.state == "running":
        time.sleep(1)
        data = _request(target, "GET", f"/api/v1/mirror/fetches/{quote(fetch.id, safe='')}")
        fetch = _mirror_read(data, Fetch)
        line = fetch.progress.describe() if fetch.progress else ""
        if line and line != said and not target.as_json:
            click.echo(line, err=True)
            said = line
    if target.as_json:
        _print_json(data)
    elif fetch.fetched is not None:
        model = fetch.fetched
        click.echo(
            f"fetched {model.repo}@{model.revision} (commit {model.commit}): {len(model.files)} files, "
            f"{human_bytes(model.size, None)}"
        )
    if fetch.state == "failed":
        _fail(fetch.error or "the fetch failed", EXIT_ERROR)


@mirror.command("rm")
@click.argument("ref", metavar="REPO@REVISION")
@json_option
@click.pass_context
def mirror_rm(ctx: click.Context, ref: str, as_json: bool) -> None:
    """Delete a model from the mirror: a commit of it, or the revision it was fetched as."""
    target = _target(ctx, as_json)
    data = _request(target, "DELETE", f"/api/v1/mirror/models?{urlencode({'model': ref})}")
    if target.as_json:
        _print_json(data)
        return
    click.echo(f"removed {data.get('removed')} ({human_bytes(int(data.get('bytes') or 0), None)})")


def _mirror_read(data: Any, view: Any) -> Any:
    """The mirror's reply as the type it is; a reply of another shape ends the command saying so."""
    try:
        return _MIRROR_CONVERTER.structure(data, view)
    except cattrs.BaseValidationError:
        _fail(
            "the mirror's reply is not one this ctl reads; is the mirror another llmgw version?", EXIT_ERROR
        )


_MIRROR_CONVERTER = cattrs.Converter()


@ctl.command("new-token")
def new_token() -> None:
    """Make an admin token: the token on stdout, the line for server.yaml on stderr."""
    token = make_token()
    click.echo(token)
    click.echo(
        "add its digest to server.yaml and restart the server; only the digest is kept there:\n"
        f"admin_tokens:\n  - {hash_token(token)}",
        err=True,
    )


ctl.add_command(engine_check)


# Last: these modules use this one's helpers to reach the admin API.
from llmgw.cli.model_plan import model_plan  # noqa: E402

model.add_command(model_plan)
ctl.add_command(bench)
ctl.add_command(upgrade)
