"""`llmgw ctl bench MODEL`: streaming chat requests through the gateway, one concurrency after another.

The load goes where an application's would, the gateway's client port, with an
API key; the engine's queue and KV cache are read meanwhile from its own
metrics through the admin API (`GET /api/v1/replicas/{shard_id}/metrics`), so
a person sees whether a slow first token was a queue or a full cache.
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
from llmgw.bench.load import Offer, hold, level
from llmgw.bench.result import Level, Run
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


async def _reading(admin: Target, model: str, engines: set[str]) -> EngineLoad | None:
    """One moment's load over the model's ready replicas: queues summed, the fullest cache."""
    status, data = await call(admin, "GET", f"/api/v1/replicas?model={quote(model, safe='')}")
    if status != 200:
        return None
    loads: list[EngineLoad] = []
    for replica in _ready(data, model):
        engines.add(replica.engine)
        status, page = await call(admin, "GET", f"/api/v1/replicas/{url_segment(replica.shard_id)}/metrics")
        if status == 200:
            loads.append(engine_load(views.CONVERTER.structure(page, views.ReplicaMetrics).metrics))
    if not loads:
        return None
    queues = [x.queue_depth for x in loads if x.queue_depth is not None]
    kvs = [x.kv_cache for x in loads if x.kv_cache is not None]
    return EngineLoad(queue_depth=sum(queues) if queues else None, kv_cache=max(kvs) if kvs else None)


async def _sample(admin: Target, model: str, readings: list[EngineLoad], engines: set[str]) -> None:
    """Read the replicas' load until cancelled; a page that does not answer is a reading missed."""
    while True:
        try:
            reading = await _reading(admin, model, engines)
        except (aiohttp.ClientError, TimeoutError, cattrs.BaseValidationError):
            # The benchmark is the point; a metrics page that fails leaves "not reported", not a crash.
            reading = None
        if reading is not None:
            readings.append(reading)
        await asyncio.sleep(SAMPLE_INTERVAL_S)


async def _level(admin: Target, offer: Offer, concurrency: int, seconds: float, engines: set[str]) -> Level:
    readings: list[EngineLoad] = []
    sampler = asyncio.create_task(_sample(admin, offer.model, readings, engines))
    try:
        tally, took = await hold(offer, concurrency, seconds)
        # One reading at the end too: a level shorter than the interval still gets one.
        with contextlib.suppress(aiohttp.ClientError, TimeoutError, cattrs.BaseValidationError):
            last = await _reading(admin, offer.model, engines)
            if last is not None:
                readings.append(last)
    finally:
        sampler.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await sampler
    return level(concurrency, tally, took, peak(readings), len(readings))


async def _run(admin: Target, offer: Offer, concurrencies: list[int], seconds: float) -> Run:
    started = datetime.now(UTC).isoformat(timespec="seconds")
    engines: set[str] = set()
    levels = [await _level(admin, offer, n, seconds, engines) for n in concurrencies]
    return Run(
        model=offer.model,
        started_at=started,
        prompt_tokens=offer.prompt_tokens,
        max_tokens=offer.max_tokens,
        seconds=seconds,
        levels=levels,
        engines=sorted(engines),
    )


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
    help=f"Prompt length, 1 to {said(MAX_PROMPT_TOKENS)}.",
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
    """Load MODEL through the gateway and report, per concurrency, latency, throughput and errors.

    TTFT p50/p95 and inter-token latency (p50) in milliseconds, output tokens and requests per
    second, failed requests; and the engine's peak queue and KV-cache occupancy, read from its
    own metrics during the level ("not reported" where the engine has no such figure).
    """
    admin = target(ctx, as_json)
    replicas = _ready(request(admin, "GET", f"/api/v1/replicas?model={quote(model, safe='')}"), model)
    if not replicas:
        fail(f"{model} has no ready replica to measure (`llmgw ctl explain {model}` says why)", EXIT_ERROR)
    url = _gateway(ctx, admin, gateway) + "/v1/chat/completions"
    offer = Offer(url=url, key=key, model=model, prompt_tokens=prompt_tokens, max_tokens=max_tokens)
    try:
        run = asyncio.run(_run(admin, offer, concurrencies, seconds))
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


def _figure(value: float | None, unit: str = "") -> str:
    return NOT_REPORTED if value is None else f"{value:g}{unit}"


def _print(run: Run) -> None:
    click.echo(
        f"{run.model}: {run.prompt_tokens}-token prompts, max_tokens {run.max_tokens}, "
        f"{run.seconds:g} s per level" + (f" ({', '.join(run.engines)})" if run.engines else "")
    )
    echo_table(
        ["CONC", "REQS", "ERRS", "TTFT P50", "TTFT P95", "ITL P50", "TOK/S", "REQ/S", "QUEUE", "KV CACHE"],
        [
            [
                str(x.concurrency),
                str(x.requests),
                str(x.errors),
                _figure(x.ttft_p50_ms, " ms"),
                _figure(x.ttft_p95_ms, " ms"),
                _figure(x.itl_p50_ms, " ms"),
                f"{x.output_tokens_per_s:.1f}",
                f"{x.requests_per_s:.2f}",
                _figure(x.queue_depth_max),
                NOT_REPORTED if x.kv_cache_max is None else f"{x.kv_cache_max:.0%}",
            ]
            for x in run.levels
        ],
    )
    for x in run.levels:
        if x.error:
            click.echo(f"concurrency {x.concurrency}: {x.errors} failed; the first: {x.error}", err=True)
