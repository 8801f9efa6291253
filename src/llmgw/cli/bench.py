"""`llmgw ctl bench MODEL`: streaming chat requests through the gateway, one concurrency after another.

The load goes where an application's would, the gateway's client port, with an
API key; the engine's queue and KV cache are read meanwhile from its own
metrics through the admin API (`GET /api/v1/replicas/{shard_id}/metrics`), so
a person sees whether a slow first token was a queue or a full cache.

A model with no ready replica of its own is measured through the fallback the
gateway serves it with: one unmeasured request finds which (its
`x-llmgw-model`), and the metrics read are that model's replicas'.
"""

from __future__ import annotations

import asyncio
import contextlib
from datetime import UTC, datetime
from urllib.parse import quote

import aiohttp
import cattrs
import click

from llmgw import maxima, strictjson
from llmgw.adminapi import views
from llmgw.bench.engineload import EngineLoad, engine_load, peak
from llmgw.bench.load import Offer, hold, level, probe
from llmgw.bench.result import Level, Run, describe, percent
from llmgw.cli.adminclient import (
    Target,
    call,
    error_text,
    exchange,
    fail,
    gateway_url,
    json_option,
    request,
    target,
)
from llmgw.cli.exit import EXIT_ERROR, EXIT_USAGE
from llmgw.cli.params import Bounded
from llmgw.cli.table import echo_table
from llmgw.maxima import MAX_BENCH_SECONDS, MAX_CONCURRENCY, MAX_PROMPT_TOKENS, MAX_TOKENS, said
from llmgw.names import url_segment

# Often enough to catch a queue that builds for a second; rarely enough that reading the pages
# (a scrape per replica, through the control plane) is not load of its own.
SAMPLE_INTERVAL_S = 0.5
NOT_REPORTED = "not reported"


def _levels(ctx: click.Context, param: click.Parameter, value: str) -> list[int]:
    parts = [part for part in value.split(",") if part.strip()]
    if not parts:
        raise click.BadParameter(f"{value!r} is not a list of whole numbers such as 1,4,16")
    try:
        # ASCII digits, each bounded: int() read "٤", and 10**9 requests in flight filled the memory.
        return [
            int(maxima.read(part, "a concurrency", MAX_CONCURRENCY, whole=True, least=1)) for part in parts
        ]
    except ValueError as exc:
        raise click.BadParameter(f"{value!r} is not a list of whole numbers such as 1,4,16: {exc}") from None


def _ready(data: object, model: str) -> list[views.Replica]:
    replicas = views.CONVERTER.structure(data, list[views.Replica])
    return [r for r in replicas if r.model == model and r.state == "ready"]


async def _reading(admin: Target, served: set[str], engines: set[str]) -> EngineLoad | None:
    """One moment's load over the ready replicas of the models serving: queues summed, the fullest cache."""
    loads: list[EngineLoad] = []
    for model in sorted(served):
        status, data = await call(admin, "GET", f"/api/v1/replicas?model={quote(model, safe='')}")
        if status != 200:
            continue
        for replica in _ready(data, model):
            engines.add(replica.engine)
            path = f"/api/v1/replicas/{url_segment(replica.shard_id)}/metrics"
            status, page = await call(admin, "GET", path)
            if status == 200:
                loads.append(engine_load(views.CONVERTER.structure(page, views.ReplicaMetrics).metrics))
    if not loads:
        return None
    queues = [x.queue_depth for x in loads if x.queue_depth is not None]
    kvs = [x.kv_cache for x in loads if x.kv_cache is not None]
    return EngineLoad(queue_depth=sum(queues) if queues else None, kv_cache=max(kvs) if kvs else None)


async def _sample(admin: Target, served: set[str], readings: list[EngineLoad], engines: set[str]) -> None:
    """Read the replicas' load until cancelled; a page that does not answer is a reading missed."""
    while True:
        try:
            reading = await _reading(admin, served, engines)
        except (aiohttp.ClientError, TimeoutError, cattrs.BaseValidationError):
            # The benchmark is the point; a metrics page that fails leaves "not reported", not a crash.
            reading = None
        if reading is not None:
            readings.append(reading)
        await asyncio.sleep(SAMPLE_INTERVAL_S)


async def _level(
    admin: Target, offer: Offer, concurrency: int, seconds: float, engines: set[str], served: set[str]
) -> Level:
    readings: list[EngineLoad] = []
    # served is shared with the requests: a fallback that begins to serve mid-level is read from then.
    sampler = asyncio.create_task(_sample(admin, served, readings, engines))
    try:
        tally, took = await hold(offer, concurrency, seconds, served)
        # One reading at the end too: a level shorter than the interval still gets one.
        with contextlib.suppress(aiohttp.ClientError, TimeoutError, cattrs.BaseValidationError):
            last = await _reading(admin, served, engines)
            if last is not None:
                readings.append(last)
    finally:
        sampler.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await sampler
    return level(concurrency, tally, took, peak(readings), len(readings))


async def _run(
    admin: Target, offer: Offer, concurrencies: list[int], seconds: float, served: set[str]
) -> Run:
    started = datetime.now(UTC).isoformat(timespec="seconds")
    engines: set[str] = set()
    levels = [await _level(admin, offer, n, seconds, engines, served) for n in concurrencies]
    return Run(
        model=offer.model,
        started_at=started,
        prompt_tokens=offer.prompt_words,
        max_tokens=offer.max_tokens,
        seconds=seconds,
        levels=levels,
        engines=sorted(engines),
        served_by=sorted(served),
    )


def _serving(model: str, offer: Offer, replicas: list[views.Replica]) -> set[str]:
    """The models serving model now: itself with a ready replica, else the fallback the gateway picks."""
    if replicas:
        return {model}
    try:
        tried = asyncio.run(probe(offer))
    except aiohttp.InvalidURL:
        fail(f"--gateway {offer.url} is not a URL; expected one like http://127.0.0.1:8080", EXIT_USAGE)
    # The model itself, where a replica of its own became ready meanwhile.
    if not tried.served:
        said = f"; the gateway answered {tried.error}" if tried.error else ""
        fail(
            f"{model} has no ready replica to measure, nor a fallback that serves it{said} "
            f"(`llmgw ctl explain {model}` says why)",
            EXIT_ERROR,
        )
    return tried.served


def _gateway(ctx: click.Context, admin: Target, given: str | None) -> str:
    if given:
        return given.rstrip("/")
    # `--server https://HOST/admin` is the admin API on the client port: the gateway is the rest.
    if admin.url.endswith("/admin"):
        return admin.url.removesuffix("/admin")
    return gateway_url(admin.config_path)


@click.command("bench")
@click.argument("model")
@click.option(
    "--concurrency",
    "concurrencies",
    default="1,4,16",
    show_default=True,
    callback=_levels,
    help=f"Requests kept in flight at once, one level after another; each 1 to {said(MAX_CONCURRENCY)}.",
)
@click.option(
    "--prompt-tokens",
    type=Bounded("--prompt-tokens", MAX_PROMPT_TOKENS, whole=True, least=1),
    default=128,
    show_default=True,
    help=f"Words in each prompt, 1 to {said(MAX_PROMPT_TOKENS)}; the tokens they make, as the engine "
    "counts them, are reported.",
)
@click.option(
    "--max-tokens",
    type=Bounded("--max-tokens", MAX_TOKENS, whole=True, least=1),
    default=128,
    show_default=True,
    help=f"Each reply's max_tokens, 1 to {said(MAX_TOKENS)}.",
)
@click.option(
    "--seconds",
    type=Bounded("--seconds", MAX_BENCH_SECONDS, whole=False, above=True),
    default=30.0,
    show_default=True,
    help="How long each concurrency is held (requests under way then run to their end), at most "
    f"{said(MAX_BENCH_SECONDS)}.",
)
@click.option("--key", envvar="LLMGW_API_KEY", help="An API key for the gateway (`llmgw keys create bench`).")
@click.option(
    "--gateway",
    envvar="LLMGW_GATEWAY",
    help="The gateway's base URL [default: the server's `listen`, as it bound it].",
)
@click.option(
    "--keep/--no-keep",
    default=True,
    show_default=True,
    help="Keep the run on the server (`GET /api/v1/models/MODEL/bench` reads it back).",
)
@json_option
@click.pass_context
def bench(
    ctx: click.Context,
    model: str,
    concurrencies: list[int],
    prompt_tokens: int,
    max_tokens: int,
    seconds: float,
    key: str | None,
    gateway: str | None,
    keep: bool,
    as_json: bool,
) -> None:
    """Load MODEL through the gateway and report, per concurrency, latency, tokens and throughput.

    TTFT, TPOT, ITL and end to end at p50/p95/p99 in milliseconds; input and output tokens as the
    engine counted them; requests, output tokens and all tokens per second; failed requests; and
    the engine's peak queue and KV-cache occupancy, read from its own metrics during the level
    ("not reported" where the engine has no such figure). A model with no ready replica is
    measured through the fallback that serves it.
    """
    admin = target(ctx, as_json)
    replicas = _ready(request(admin, "GET", f"/api/v1/replicas?model={quote(model, safe='')}"), model)
    url = _gateway(ctx, admin, gateway) + "/v1/chat/completions"
    offer = Offer(url=url, key=key, model=model, prompt_words=prompt_tokens, max_tokens=max_tokens)
    served = _serving(model, offer, replicas)
    try:
        run = asyncio.run(_run(admin, offer, concurrencies, seconds, served))
    except aiohttp.InvalidURL:
        fail(f"--gateway {url} is not a URL; expected one like http://127.0.0.1:8080", EXIT_USAGE)
    if keep:
        _keep(admin, run)
    if admin.as_json:
        click.echo(strictjson.dumps(views.CONVERTER.unstructure(run), indent=2, sort_keys=True))
        return
    _print(run)


def _keep(admin: Target, run: Run) -> None:
    """Keep run on the server; one that cannot (an older server) says so and the run is still printed."""
    body = views.CONVERTER.unstructure(run)
    status, data = exchange(admin, "POST", f"/api/v1/models/{url_segment(run.model)}/bench", body)
    if status >= 400:
        click.echo(f"llmgw ctl: the run was not kept on the server: {error_text(data, status)}", err=True)


def _figure(value: float | None) -> str:
    return NOT_REPORTED if value is None else f"{value:g}"


def _quantiles(*values: float | None) -> str:
    """p50/p95/p99 in one cell: "12.3/15.1/16.0"; "none" when no request gave the figure."""
    if all(v is None for v in values):
        return "none"
    # Three figures under 10 ms: the sim engine's 0.007 ms gaps read "0.0" at one decimal.
    return "/".join("-" if v is None else f"{v:.1f}" if v >= 10 else f"{v:.3g}" for v in values)


def _row(x: Level) -> list[str]:
    return [
        str(x.concurrency),
        str(x.requests),
        str(x.errors),
        _quantiles(x.ttft_p50_ms, x.ttft_p95_ms, x.ttft_p99_ms),
        _quantiles(x.tpot_p50_ms, x.tpot_p95_ms, x.tpot_p99_ms),
        _quantiles(x.itl_p50_ms, x.itl_p95_ms, x.itl_p99_ms),
        _quantiles(x.e2e_p50_ms, x.e2e_p95_ms, x.e2e_p99_ms),
        NOT_REPORTED
        if x.input_tokens is None or x.requests == x.requests_without_usage
        else str(x.input_tokens),
        str(x.output_tokens),
        f"{x.requests_per_s:.2f}",
        f"{x.output_tokens_per_s:.1f}",
        NOT_REPORTED if x.total_tokens_per_s is None else f"{x.total_tokens_per_s:.1f}",
        _figure(x.queue_depth_max),
        percent(x.kv_cache_max) or NOT_REPORTED,
    ]


def _print(run: Run) -> None:
    click.echo(f"{run.model}: {describe(run)}" + (f" ({', '.join(run.engines)})" if run.engines else ""))
    click.echo("latencies in ms, p50/p95/p99; tokens as the engine counted them")
    echo_table(
        [
            "CONC",
            "REQS",
            "ERRS",
            "TTFT",
            "TPOT",
            "ITL",
            "E2E",
            "IN TOKENS",
            "OUT TOKENS",
            "REQ/S",
            "OUT TOK/S",
            "TOTAL TOK/S",
            "QUEUE",
            "KV CACHE",
        ],
        [_row(x) for x in run.levels],
    )
    for x in run.levels:
        if x.error:
            click.echo(f"concurrency {x.concurrency}: {x.errors} failed; the first: {x.error}", err=True)
        if x.requests_without_usage:
            click.echo(
                f"concurrency {x.concurrency}: {x.requests_without_usage} of {x.requests} replies carried "
                "no usage: their output tokens are their chunks counted, their input tokens are not counted",
                err=True,
            )
