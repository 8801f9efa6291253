"""The cluster, models and node-logs pages, on the admin listener and under /admin on the client port.

They render the admin API's own views (adminapi/views.py) through the presenter
`llmgw ctl` uses too (adminapi/present.py), so a page and ctl never disagree.
"""

from __future__ import annotations

import asyncio
from importlib import resources
from pathlib import Path
from urllib.parse import quote, urlencode

import attrs
from aiohttp import web
from markupsafe import Markup

from llmgw.adminapi import projections
from llmgw.adminapi.bench import read_runs, runs_dir
from llmgw.adminapi.handlers import (
    BACKOFF_KEY,
    CONFIG_KEY,
    INVENTORY_KEY,
    backoff_now,
    control_plane_view,
    unpriced,
)
from llmgw.adminapi.present import (
    LOG_PAGE_FOLLOW_S,
    LOG_PAGE_LINES,
    ago,
    control_plane_line,
    node_row,
    refused_line,
    replica_state,
    unattended_note,
)
from llmgw.adminapi.routes import Param, Reply, Route
from llmgw.adminapi.scaling import scale_view
from llmgw.bench.result import Run, describe, percent
from llmgw.catalog import CATALOG_KEY
from llmgw.control.nodelogs import DEFAULT_LINES, MAX_LINES
from llmgw.gateway.endpoints import ENDPOINTS_KEY
from llmgw.names import id_number
from llmgw.web.chart import Series, colour, level_lines
from llmgw.web.history import HISTORY_KEY, gpu_charts, model_charts
from llmgw.web.render import render

# The newest failures the cluster page lists; the models page has each model's own.
CLUSTER_PAGE_FAILURES = 20
# Nodes on one page of the cluster page, with their GPU charts: a few milliseconds of the loop the
# gateway serves on to build and draw. All of 10,000 at once held it for seconds.
NODES_PER_PAGE = 100
# The newest runs of `ctl bench` the models page draws for each model; the admin API has all it keeps.
BENCH_RUNS_SHOWN = 3

_ASSETS = {"cluster.css": "text/css", "cluster.js": "text/javascript"}


@attrs.frozen
class Paths:
    """Where the pages are: "/" on the admin listener, "/admin/cluster" on the client port."""

    cluster: str
    base: str

    def models(self) -> str:
        return f"{self.base}/models"

    def logs(self, node: str, **query: str | int) -> str:
        path = f"{self.base}/nodes/{quote(node, safe='')}/logs"
        return f"{path}?{urlencode(query)}" if query else path


PATHS_KEY = web.AppKey("llmgw.web.cluster.paths", Paths)
ASSETS_KEY = web.AppKey("llmgw.web.cluster.assets", dict[str, bytes])


# --- pages ------------------------------------------------------------------------------------


@attrs.frozen
class Pager:
    """Where a page of the cluster page's nodes lies among them all, with links to its neighbours."""

    first: int
    last: int
    total: int
    previous: str
    next: str


async def cluster_page(request: web.Request) -> web.StreamResponse:
    inventory = request.config_dict[INVENTORY_KEY]
    paths = request.config_dict[PATHS_KEY]
    history = request.config_dict.get(HISTORY_KEY)
    nodes = sorted(inventory.nodes(), key=lambda n: n.id)
    pages = max(1, -(-len(nodes) // NODES_PER_PAGE))
    try:
        page = _page(request.query.get("page"), pages)
    except ValueError as exc:
        return await _bad_link(request, f"{exc}.")
    shown = nodes[(page - 1) * NODES_PER_PAGE : page * NODES_PER_PAGE]
    now = inventory.now()
    pager = Pager(
        first=(page - 1) * NODES_PER_PAGE + 1,
        last=(page - 1) * NODES_PER_PAGE + len(shown),
        total=len(nodes),
        previous=f"{paths.cluster}?page={page - 1}" if page > 1 else "",
        next=f"{paths.cluster}?page={page + 1}" if page < pages else "",
    )
    return await render(
        request,
        "admin_cluster.html",
        paths=paths,
        summary=projections.status_view(
            inventory, request.config_dict[CATALOG_KEY].models(), control_plane_view(request)
        ),
        nodes=[node_row(projections.node_view(n, inventory, now)) for n in shown],
        pager=pager if pages > 1 else None,
        failures=projections.failures_view(inventory)[:CLUSTER_PAGE_FAILURES],
        backing_off=_backing_off(request),
        refused_line=refused_line,
        control_plane_line=control_plane_line,
        unattended_note=unattended_note,
        ago=ago,
        history=history is not None,
        charts=model_charts(history) if history is not None else [],
        gpu_charts=gpu_charts(history, [n.id for n in shown]) if history is not None else [],
    )


def _page(value: str | None, pages: int) -> int:
    """The page a link asks for, 1 when it names none; ValueError, in words, for one there is not."""
    if not value:
        return 1
    # ASCII digits, as everywhere a number is read: int() also reads "٢" and "1_0".
    page = id_number(value)
    if page is None:
        raise ValueError(f"page is {value!r}; expected a page number from 1 to {pages}")
    if not 1 <= page <= pages:
        raise ValueError(
            f"there is no page {page}: the nodes fill {pages} page{'s' if pages > 1 else ''} "
            f"of {NODES_PER_PAGE}"
        )
    return page


def _backing_off(request: web.Request) -> list[tuple[str, str]]:
    """(model, "node n1 is backing off after 2 failures (next try in 10 s): why"), a line per node."""
    backoff = request.config_dict.get(BACKOFF_KEY)
    if backoff is None:
        return []
    return [(model, f"node {node} {b.reason()}") for (model, node), b in sorted(backoff().items())]


async def models_page(request: web.Request) -> web.StreamResponse:
    inventory = request.config_dict[INVENTORY_KEY]
    paths = request.config_dict[PATHS_KEY]
    # Each with whether budgets bind on it: /admin/quotas says so only where a budget is set.
    catalog = request.config_dict[CATALOG_KEY].models()
    endpoints = request.config_dict.get(ENDPOINTS_KEY)
    backoff = backoff_now(request)
    models = [
        projections.model_view(m, inventory, unpriced(request, m), endpoints, backoff, scale_view(request, m))
        for m in catalog
    ]
    history = request.config_dict.get(HISTORY_KEY)
    charts = {m.name: model_charts(history, m.name) for m in models} if history is not None else {}
    # In a thread, as the admin route reads them: a disk slow to answer must not stall the gateway.
    state_dir = Path(request.config_dict[CONFIG_KEY].state_dir)
    runs = await asyncio.to_thread(_newest_runs, state_dir, [m.name for m in models])
    return await render(
        request,
        "admin_models.html",
        paths=paths,
        models=models,
        charts=charts,
        bench={name: [(run_label(run), run_charts(run)) for run in kept] for name, kept in runs.items()},
        ago=ago,
        replica_state=replica_state,
    )


def _newest_runs(state_dir: Path, names: list[str]) -> dict[str, list[Run]]:
    return {name: read_runs(runs_dir(state_dir, name), BENCH_RUNS_SHOWN) for name in names}


def run_label(run: Run) -> str:
    """ "2025-06-01T12:00:00Z · llamacpp · 32-word prompts (40 input tokens each), ...": describe()'s words,
    as ctl bench prints them, and the fullest KV cache in the precision the engine gave it."""
    engines = ", ".join(run.engines) or "engine not reported"
    kvs = [level.kv_cache_max for level in run.levels if level.kv_cache_max is not None]
    cache = f" · KV cache at most {percent(max(kvs))}" if kvs else ""
    return f"{run.started_at} · {engines} · {describe(run)}{cache}"


def run_charts(run: Run) -> list[Markup]:
    """TTFT, TPOT and output tokens/s of one run, over its concurrency levels."""
    levels = [level.concurrency for level in run.levels]

    def seconds(ms: float | None) -> float | None:
        return None if ms is None else ms / 1000

    def quantiles(title: str, *fields: str) -> Markup:
        return level_lines(
            f"{title}, run {run.started_at}",
            levels,
            [
                (
                    Series(field.split("_")[1], colour(i)),
                    [seconds(getattr(level, field)) for level in run.levels],
                )
                for i, field in enumerate(fields)
            ],
            unit="s",
        )

    return [
        quantiles("TTFT", "ttft_p50_ms", "ttft_p95_ms", "ttft_p99_ms"),
        quantiles("TPOT", "tpot_p50_ms", "tpot_p95_ms", "tpot_p99_ms"),
        level_lines(
            f"output tokens/s, run {run.started_at}",
            levels,
            [(Series("total", colour(3)), [level.output_tokens_per_s for level in run.levels])],
        ),
    ]


async def node_logs_page(request: web.Request) -> web.StreamResponse:
    inventory = request.config_dict[INVENTORY_KEY]
    paths = request.config_dict[PATHS_KEY]
    node = request.match_info["id"]
    source = request.query.get("source", "") or "agent"
    # A link with a lines or follow the page cannot honour is refused in words: shown the default
    # instead, it read as if the page had done what was asked.
    try:
        count = projections.parse_lines(request.query.get("lines"))
    except ValueError as exc:
        return await _bad_link(request, f"{exc}.")
    if request.query.get("follow", "") not in ("", "1"):
        return await _bad_link(
            request, f"follow is {request.query['follow']!r}; expected 1 (follow) or nothing (do not)."
        )
    follow = request.query.get("follow", "") == "1"
    _, view = await projections.fetch_log(inventory, node, source, count)

    def here(**changes: str | int) -> str:
        query: dict[str, str | int] = {"source": source, "lines": count}
        if follow:
            query["follow"] = 1
        query.update(changes)
        return paths.logs(node, **{k: v for k, v in query.items() if v != ""})

    response = await render(
        request,
        "admin_node_logs.html",
        status=404 if inventory.node(node) is None else 200,
        paths=paths,
        node=node,
        source=source,
        count=count,
        follow=follow,
        follow_s=LOG_PAGE_FOLLOW_S,
        view=view,
        tabs=[(s, here(source=s), s == source) for s in view.sources],
        counts=[(n, here(lines=n), n == count) for n in LOG_PAGE_LINES],
        toggle=here(follow="") if follow else here(follow=1),
    )
    if follow:
        # The page reloads itself, without a script: the header works where scripts are refused.
        response.headers["Refresh"] = str(LOG_PAGE_FOLLOW_S)
    return response


async def _bad_link(request: web.Request, message: str) -> web.StreamResponse:
    return await render(request, "message.html", status=400, title="This link is not right", message=message)


async def asset(request: web.Request) -> web.StreamResponse:
    name = request.match_info["name"]
    body = request.config_dict[ASSETS_KEY].get(name)
    if body is None:
        raise web.HTTPNotFound()
    return web.Response(body=body, content_type=_ASSETS[name], headers={"Cache-Control": "max-age=3600"})


def _read_assets() -> dict[str, bytes]:
    root = resources.files("llmgw.web") / "static"
    return {name: (root / name).read_bytes() for name in _ASSETS}


async def _load_assets(app: web.Application) -> None:
    # In a thread: a file read on the loop would stall every request while the disk answers.
    app[ASSETS_KEY].update(await asyncio.to_thread(_read_assets))


def provide(app: web.Application, prefix: str) -> None:
    """Put where the pages are under prefix ("" or "/admin") in app, and the assets to load at start-up."""
    app[PATHS_KEY] = Paths(cluster=CLUSTER.at(prefix), base=prefix)
    app[ASSETS_KEY] = {}
    app.on_startup.append(_load_assets)


# --- the table --------------------------------------------------------------------------------

_HTML = Reply("HTML.", html=True)

CLUSTER = Route(
    method="GET",
    path="/",
    prefixed="/cluster",
    handler=cluster_page,
    operation="cluster",
    summary="The cluster page: every node, its resources, engines and replicas.",
    replies={200: _HTML},
    link="Cluster",
)

PAGES: tuple[Route, ...] = (
    CLUSTER,
    Route(
        method="GET",
        path="/models",
        handler=models_page,
        operation="modelsPage",
        summary="Each model, its replicas, where they run and their state.",
        replies={200: _HTML},
        link="Models",
    ),
    Route(
        method="GET",
        path="/nodes/{id}/logs",
        handler=node_logs_page,
        operation="nodeLogsPage",
        summary=f"One of a node's logs: a tab per source, {LOG_PAGE_LINES[0]} to {LOG_PAGE_LINES[-1]} lines, "
        f"following every {LOG_PAGE_FOLLOW_S} s.",
        parameters=(
            Param("id", description="The node's id: its certificate's common name."),
            Param("source", "query", schema={"type": "string", "default": "agent"}),
            Param(
                "lines",
                "query",
                f"How many of the newest lines; the page offers {LOG_PAGE_LINES}.",
                {"type": "integer", "minimum": 1, "maximum": MAX_LINES, "default": DEFAULT_LINES},
            ),
            Param("follow", "query", "1: reload every few seconds.", {"type": "string", "enum": ["1"]}),
        ),
        replies={
            200: _HTML,
            400: Reply("A lines or follow the page cannot show, in a sentence.", html=True),
            404: Reply("No such node: the page says so.", html=True),
        },
    ),
)

# The pages' stylesheet and script; files, at the root on either listener, not in the document.
ASSETS = Route(
    method="GET",
    path="/static/{name}",
    handler=asset,
    summary="The cluster pages' stylesheet and script.",
    parameters=(Param("name", pattern=r"cluster\.(?:css|js)"),),
)
