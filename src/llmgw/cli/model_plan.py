"""`llmgw ctl model plan SOURCE`: will a model fit, and where, from its files' headers alone.

Files on the machine ctl runs on are read here (capacity/shape.py reads their
headers, never the weights); a model elsewhere (a catalog model's http(s) or
`mirror:` source, or REPO@REVISION on the mirror) has its headers read by the
server, with placement's reader. The admin API also gives the fleet's cards and
memory, and a catalog model's source and profiles.
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import quote, urlparse

import click

from llmgw import strictjson
from llmgw.adminapi import views
from llmgw.capacity.estimate import gigabytes, loads_weights
from llmgw.capacity.fleet import Capacity, CatalogModel, ProfileShape
from llmgw.capacity.ggufmeta import HeaderError
from llmgw.capacity.plan import Plan, make_plan
from llmgw.capacity.shape import ModelShape, read_shape
from llmgw.cli.adminclient import exchange, fail, json_option, read, target
from llmgw.cli.exit import EXIT_ERROR, EXIT_NOT_FOUND, EXIT_USAGE
from llmgw.cli.params import Bounded
from llmgw.cli.table import echo_table
from llmgw.hubref import SOURCE_PREFIX
from llmgw.maxima import MAX_PARALLEL, MAX_TOKENS, said


def _local(source: str) -> Path | None:
    """The path a source names on this machine, if it names one: a path, or a file:// URL."""
    if not source:
        # Not ".": a model without a source (the sim's) has no files, here or anywhere.
        return None
    if source.startswith("file://"):
        return Path(urlparse(source).path)
    if "://" in source or source.startswith("mirror:"):
        return None
    return Path(source).expanduser()


def _shape(path: Path) -> ModelShape:
    try:
        return read_shape(path)
    except HeaderError as exc:
        fail(str(exc), EXIT_ERROR)


def _fleet(ctx: click.Context, as_json: bool, query: str, name: str | None = None) -> Capacity:
    admin = target(ctx, as_json)
    status, data = exchange(admin, "GET", "/api/v1/capacity" + query)
    if status == 404 and name:
        fail(f"{name} is neither a file or directory here nor a model in the catalog", EXIT_NOT_FOUND)
    if status >= 400:
        fail(str((data or {}).get("error") or f"the server answered {status}"), EXIT_ERROR)
    return read(data, Capacity)


def _mirror_ref(source: str, path: Path | None) -> bool:
    """REPO@REVISION, not a path here: a model on the mirror."""
    return "@" in source and path is not None and not path.exists() and source.count("/") == 1


def _weightless(model: CatalogModel) -> None:
    """Refuse a catalog model with no source: it has no files to read, and the cwd is not them."""
    if model.source:
        return
    engines = sorted({p.engine for p in model.profiles})
    if engines and not any(loads_weights(e) for e in engines):
        names = " and ".join(engines)
        fail(f"{model.name} has no weights to plan: the {names} engine loads none", EXIT_USAGE)
    fail(f"{model.name} has no source: there are no files to plan", EXIT_USAGE)


def _resolve(ctx: click.Context, source: str, as_json: bool) -> tuple[ModelShape, Capacity]:
    """The model's shape and the fleet: a local file or directory, else as the server reads it.

    A catalog model's files are read here when its source is a path on this
    machine; otherwise (an http(s) URL, `mirror:`) and for REPO@REVISION, the
    server reads their headers, as placement does.
    """
    path = _local(source)
    if path is not None and path.exists():
        shape = _shape(path)
        return shape, _fleet(ctx, as_json, "")
    if _mirror_ref(source, path):
        fleet = _fleet(ctx, as_json, "?source=" + quote(SOURCE_PREFIX + source, safe=""))
    else:
        fleet = _fleet(ctx, as_json, "?model=" + quote(source, safe=""), source)
        if fleet.model is None:
            fail(f"the server did not describe {source}", EXIT_ERROR)
        _weightless(fleet.model)
        where = _local(fleet.model.source)
        if where is not None and where.exists():
            return _shape(where), fleet
    if fleet.shape is None:
        model_source = fleet.model.source if fleet.model is not None else SOURCE_PREFIX + source
        why = fleet.shape_error or "it is neither an http(s) URL nor a mirror: source"
        fail(
            f"{source}'s source {model_source or '(none)'} is not a file or directory on this machine: "
            f"run this where its files are, or give their path; the server could not read its "
            f"headers: {why}",
            EXIT_USAGE,
        )
    return fleet.shape, fleet


def _profiles(fleet: Capacity, name: str | None) -> list[ProfileShape]:
    profiles = list(fleet.model.profiles) if fleet.model is not None else []
    if name is None:
        return profiles
    chosen = [p for p in profiles if p.name == name]
    if not chosen:
        have = ", ".join(p.name for p in profiles) or "none (it is not a catalog model)"
        fail(f"no profile {name}; the model's profiles: {have}", EXIT_USAGE)
    return chosen


@click.command("plan")
@click.argument("source")
@click.option(
    "--context",
    type=Bounded("--context", MAX_TOKENS, whole=True, least=1),
    help=f"Tokens per sequence, 1 to {said(MAX_TOKENS)} (default: the profile's, else the model's).",
)
@click.option(
    "--parallel",
    type=Bounded("--parallel", MAX_PARALLEL, whole=True, least=1),
    help=f"Sequences served at once, 1 to {said(MAX_PARALLEL)} (default: the profile's, else 1).",
)
@click.option("--profile", "profile_name", help="Only this profile of the catalog model.")
@json_option
@click.pass_context
def model_plan(
    ctx: click.Context,
    source: str,
    context: int | None,
    parallel: int | None,
    profile_name: str | None,
    as_json: bool,
) -> None:
    """Will SOURCE fit, and where: a GGUF file, a Hugging Face directory, REPO@REVISION or a catalog model.

    Reads the files' headers only, never the weights: the weights' bytes per file and
    quantisation, the KV cache per token, what one replica needs at CONTEXT × PARALLEL,
    and node by node, profile by profile, whether it fits and why not.
    """
    shape, fleet = _resolve(ctx, source, as_json)
    profiles = _profiles(fleet, profile_name)
    # The name its warnings use: the catalog's, else the file's or directory's own.
    name = fleet.model.name if fleet.model is not None else Path(shape.source.rstrip("/")).name
    plan = make_plan(shape, profiles, fleet.nodes, context=context, parallel=parallel, name=name)
    if target(ctx, as_json).as_json:
        click.echo(strictjson.dumps(views.CONVERTER.unstructure(plan), indent=2, sort_keys=True))
        return
    _print(plan, fleet)


def _print(plan: Plan, fleet: Capacity) -> None:
    click.echo(f"model     {plan.source} ({plan.format}, {plan.architecture})")
    click.echo(f"weights   {gigabytes(plan.weights_bytes)} ({plan.weights_bytes} bytes)")
    for f in plan.files:
        click.echo(f"  {Path(f.path).name}  {gigabytes(f.bytes)}  {f.quantisation}")
    for warning in plan.warnings:
        click.echo(f"warning   {warning}")
    for fit in plan.profiles:
        e = fit.estimate
        click.echo("")
        click.echo(f"profile {fit.profile} ({fit.engine})")
        click.echo(
            f"  KV cache  {e.kv_bytes_per_token} bytes per token ({e.kv_type or 'none'}); "
            f"{gigabytes(e.kv_bytes)} at context {e.context} × {e.parallel}"
        )
        click.echo(
            f"  replica   {gigabytes(e.total_bytes)}: weights {gigabytes(e.weights_bytes)} + "
            f"KV {gigabytes(e.kv_bytes)} + overhead {gigabytes(e.overhead_bytes)}"
        )
        if fleet.nodes:
            echo_table(
                ["NODE", "FITS", "WHY"],
                [[n.node, "yes" if n.fits else "no", n.reason] for n in fit.nodes],
            )
        else:
            click.echo("  no node has registered yet")
        click.echo(f"  {fit.summary}")
