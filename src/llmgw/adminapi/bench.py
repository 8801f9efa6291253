"""`POST/GET /api/v1/models/{name}/bench`: the runs of `llmgw ctl bench`, kept on the server.

A benchmark printed to one person's terminal is lost to the next person who asks
what the model serves; kept as a JSON file per run under
`<state_dir>/bench/<model>/`, it is there for ctl and the pages to read back.
Files rather than the store: a run is written once, read whole and never
queried, and a control plane on PostgreSQL needs no table for it.
"""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

import cattrs
from aiohttp import web

from llmgw import durable, strictjson
from llmgw.adminapi import views
from llmgw.adminapi.handlers import CONFIG_KEY
from llmgw.adminapi.replies import error, reply
from llmgw.adminapi.routes import Body, Param, Reply, Route
from llmgw.adminapi.views import Error
from llmgw.bench.result import Run
from llmgw.bodies import MAX_ADMIN_BODY, BadJson, read_json
from llmgw.catalog import CATALOG_KEY
from llmgw.names import url_segment

# The newest runs a model keeps; older files are removed as new ones come, so a benchmark
# scripted in a loop cannot fill the state directory.
KEEP = 20
_NAME = Param(
    "name",
    description="The model's name, URL-encoded as one segment (org%2Fmodel).",
    pattern=".+",
)


def runs_dir(state_dir: Path, model: str) -> Path:
    # One segment per model, an org/model too: no folder named after the org.
    return state_dir / "bench" / url_segment(model)


def _write(directory: Path, run: Run) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    stamp = run.started_at.replace(":", "")
    path = directory / f"{stamp}-{os.getpid()}-{len(list(directory.iterdir()))}.json"
    durable.write_atomically(path, strictjson.dumps(views.CONVERTER.unstructure(run), sort_keys=True) + "\n")
    for old in sorted(directory.glob("*.json"))[:-KEEP]:
        old.unlink(missing_ok=True)


def read_runs(directory: Path, newest: int = KEEP) -> list[Run]:
    """The newest runs kept in directory, newest first; a file that cannot be read is left out. Blocking."""
    runs: list[Run] = []
    for path in sorted(directory.glob("*.json"), reverse=True):
        if len(runs) >= newest:
            break
        try:
            runs.append(views.CONVERTER.structure(json.loads(path.read_text(encoding="utf-8")), Run))
        except (OSError, ValueError, cattrs.BaseValidationError):
            # Torn by a crash mid-write, or from another llmgw version: the others still show.
            continue
    return runs


def _model(request: web.Request) -> str | web.Response:
    name = request.match_info["name"]
    catalog = request.config_dict[CATALOG_KEY]
    if catalog.get(name) is None:
        return error(404, f"no model {name} in the catalog; it has {', '.join(catalog.names()) or 'nothing'}")
    return name


async def post_bench(request: web.Request) -> web.Response:
    name = _model(request)
    if isinstance(name, web.Response):
        return name
    if request.content_type != "application/json":
        return error(415, "send the run as JSON, as `llmgw ctl bench --json` prints it")
    try:
        sent = await read_json(request, MAX_ADMIN_BODY)
    except BadJson as exc:
        said = "the body is not JSON" if exc.not_json else str(exc)
        return error(exc.status, f"{said}; send the run as `llmgw ctl bench --json` prints it")
    try:
        run = views.CONVERTER.structure(sent, Run)
    except (ValueError, TypeError, cattrs.BaseValidationError):
        return error(400, "the body is not a run as `llmgw ctl bench --json` prints it")
    if run.model != name:
        return error(400, f"the run is of {run.model}, not {name}")
    state_dir = Path(request.config_dict[CONFIG_KEY].state_dir)
    await asyncio.to_thread(_write, runs_dir(state_dir, name), run)
    return reply(run, 201)


async def get_bench(request: web.Request) -> web.Response:
    name = _model(request)
    if isinstance(name, web.Response):
        return name
    state_dir = Path(request.config_dict[CONFIG_KEY].state_dir)
    return reply(await asyncio.to_thread(read_runs, runs_dir(state_dir, name)))


ROUTES: tuple[Route, ...] = (
    Route(
        method="POST",
        path="/api/v1/models/{name}/bench",
        handler=post_bench,
        operation="keepBench",
        summary="Keep a run of `llmgw ctl bench` (the newest 20 per model are kept).",
        parameters=(_NAME,),
        body=Body(Run),
        replies={
            201: Reply("It was kept.", Run),
            400: Reply("Not a run, or a run of another model.", Error),
            404: Reply("No such model in the catalog.", Error),
            415: Reply("The body is not JSON.", Error),
        },
    ),
    Route(
        method="GET",
        path="/api/v1/models/{name}/bench",
        handler=get_bench,
        operation="listBench",
        summary="The runs of `llmgw ctl bench` kept for a model, newest first.",
        parameters=(_NAME,),
        replies={
            200: Reply("The runs, newest first.", Run, many=True),
            404: Reply("No such model in the catalog.", Error),
        },
    ),
)
