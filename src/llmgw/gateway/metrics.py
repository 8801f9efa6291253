"""The gateway's Prometheus series, and the pipeline stages that count a request once it is over.

Label values are bounded so that no client can grow the series without end: a
model is one the catalog serves (the empty string for a name it does not), a
project is its id, an error code is one of the gateway's own, a node is one
that registered.

Counting a request is on every request's path, so it is plain arithmetic on
the event loop: an integer per label set in a dict, a histogram's buckets in a
list found by bisection. Only the loop writes them, so no lock is taken; the
page's thread copies each dict and list (a copy made in one C call, which no
other Python code interrupts) and turns them into Prometheus's families when a
scraper asks. prometheus-client's own metrics, with their locks, would cost
about as much again as the rest of the gateway's per-request work in these
counts alone (docs/benchmarks.md). Rare events (refusals, engines that do not
answer) use prometheus-client's counters.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import time
from bisect import bisect_left
from collections.abc import Iterable

import structlog
from aiohttp import web
from prometheus_client import CollectorRegistry, Counter
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from llmgw.catalog import Catalog
from llmgw.gateway.errors import ApiError
from llmgw.gateway.pipeline import Call, Handler
from llmgw.gateway.proxy import REQUEST_ID_HEADER
from llmgw.gateway.quotas import Quotas
from llmgw.metrics import LATENCY_BUCKETS_S

log = structlog.get_logger("llmgw.requests")

# A client's own id is kept when it is a plausible one: short, printable ASCII. Anything else (a
# megabyte of header, control characters meant for a log reader) is replaced by a fresh id.
_MAX_REQUEST_ID = 128
_STATUS_CLASSES = {1: "1xx", 2: "2xx", 3: "3xx", 4: "4xx", 5: "5xx"}
_BOUNDS = (*LATENCY_BUCKETS_S, float("inf"))
# The `le` labels as prometheus-client's own histograms write them ("0.005", "600.0", "+Inf").
_LE = tuple(floatToGoString(b) for b in _BOUNDS)  # type: ignore[no-untyped-call]
# A fresh id is this process's random prefix and a counter: unique without a system call per
# request (os.urandom is one), and not guessable across restarts.
_ID_PREFIX = os.urandom(6).hex()
_ids = itertools.count(1)


def request_id(request: web.Request) -> str:
    """The client's x-request-id when it sent a usable one, else a fresh one."""
    sent = request.headers.get(REQUEST_ID_HEADER)
    if sent and len(sent) <= _MAX_REQUEST_ID and sent.isascii() and sent.isprintable():
        return sent
    return f"{_ID_PREFIX}{next(_ids):012x}"


class _Timings:
    """One model's two histograms: per-bucket (not cumulative) counts and sums."""

    __slots__ = ("duration", "duration_sum", "first_byte", "first_byte_sum")

    def __init__(self) -> None:
        self.duration = [0] * len(_BOUNDS)
        self.duration_sum = 0.0
        self.first_byte = [0] * len(_BOUNDS)
        self.first_byte_sum = 0.0


class GatewayMetrics(Collector):
    """The gateway's series, registered in registry; counted on the loop, read by the page's thread."""

    def __init__(self, registry: CollectorRegistry, catalog: Catalog, *, log_requests: bool = False) -> None:
        # The live catalog: what makes a model name a label value rather than a client's free text.
        self._catalog = catalog
        self._log_requests = log_requests
        self.refusals = Counter(
            "llmgw_admission_refusals",
            "Requests admission refused, by the kind of scope that refused (key, project, team, org) and "
            "why (requests, tokens, budget, model_not_allowed, max_tokens; the last by scope `model`).",
            ["scope", "reason"],
            registry=registry,
        )
        self.upstream_errors = Counter(
            "llmgw_upstream_errors",
            "Requests an engine did not answer, by node and where it failed (connect: nothing reached "
            "the engine; reply: it stopped in the middle of one).",
            ["node", "stage"],
            registry=registry,
        )
        # (model, served model, project, status class, code, route) -> requests.
        self._requests: dict[tuple[str, str, str, str, str, str], int] = {}
        self._timings: dict[str, _Timings] = {}
        # (model, project) -> [prompt tokens, completion tokens].
        self._tokens: dict[tuple[str, str], list[int]] = {}
        self._costs: dict[str, float] = {}
        # Requests in flight by the model serving them: the router keeps it, around each engine call.
        self.in_flight: dict[str, int] = {}
        registry.register(self)

    def _model(self, name: str) -> str:
        return name if self._catalog.get(name) is not None else ""

    async def observe(self, call: Call, rest: Handler) -> web.StreamResponse:
        """The first stage: gives the call its request id, and counts it once the rest has finished."""
        started = time.perf_counter()
        call.request_id = request_id(call.request)
        status, code = 500, ""
        try:
            response = await rest(call)
            status = response.status
            return response
        except ApiError as err:
            status, code = err.status, err.code or ""
            if err.refusal is not None:
                self.refused(*err.refusal)
            err.headers = {**(err.headers or {}), REQUEST_ID_HEADER: call.request_id}
            raise
        except asyncio.CancelledError:
            # The client went away (nginx's 499), or the server is stopping.
            status = 499
            raise
        finally:
            ended = time.perf_counter()
            key = call.key
            self.count(
                call.model,
                call.served_model,
                str(key.project_id) if key is not None else "",
                status,
                code,
                ended - started,
                call.first_byte - started if call.first_byte else None,
                call.usage,
                call.cost,
                route=call.api.name,
            )
            if self._log_requests:
                self._log(call, status, started, ended)

    def count(
        self,
        model: str,
        served: str,
        project: str,
        status: int,
        code: str,
        seconds: float,
        first_byte_s: float | None = None,
        usage: tuple[int, int] | None = None,
        cost: float = 0.0,
        *,
        route: str = "chat",
    ) -> None:
        """Count one finished request (model and served as the client and router named them; route, the
        API it went to, apis.py's name for it)."""
        model = self._model(model)
        # served was chosen by the router among the catalog's models: already a bounded value.
        key = (model, served, project, _STATUS_CLASSES.get(status // 100, "5xx"), code, route)
        requests = self._requests
        requests[key] = requests.get(key, 0) + 1
        timings = self._timings.get(model)
        if timings is None:
            timings = self._timings[model] = _Timings()
        timings.duration[bisect_left(_BOUNDS, seconds)] += 1
        timings.duration_sum += seconds
        if first_byte_s is not None:
            timings.first_byte[bisect_left(_BOUNDS, first_byte_s)] += 1
            timings.first_byte_sum += first_byte_s
        if usage is not None:
            tokens = self._tokens.get((model, project))
            if tokens is None:
                tokens = self._tokens[(model, project)] = [0, 0]
            tokens[0] += usage[0]
            tokens[1] += usage[1]
        if cost:
            self._costs[project] = self._costs.get(project, 0.0) + cost

    def describe(self) -> Iterable[Metric]:
        return []

    def collect(self) -> Iterable[Metric]:
        """The families, from copies of the counts (safe to run in the page's thread)."""
        requests = CounterMetricFamily(
            "llmgw_requests",
            "Requests the gateway answered, by model asked for, model that served it, project, "
            "status class, error code and route (the API: chat, completions, embeddings, messages, "
            "count_tokens, responses, rerank, transcriptions).",
            labels=["model", "served_model", "project", "status", "code", "route"],
        )
        for labels, n in list(self._requests.items()):
            requests.add_metric(list(labels), n)
        duration = HistogramMetricFamily(
            "llmgw_request_duration_seconds",
            "Time from a request's arrival to the end of its reply, by model.",
            labels=["model"],
        )
        first_byte = HistogramMetricFamily(
            "llmgw_time_to_first_byte_seconds",
            "Time from a request's arrival to the first bytes of its engine's reply, by model.",
            labels=["model"],
        )
        for model, timings in list(self._timings.items()):
            for family, counts, total in (
                (duration, list(timings.duration), timings.duration_sum),
                (first_byte, list(timings.first_byte), timings.first_byte_sum),
            ):
                family.add_metric(
                    [model],
                    buckets=list(zip(_LE, itertools.accumulate(counts), strict=True)),
                    sum_value=total,
                )
        prompt = CounterMetricFamily(
            "llmgw_prompt_tokens",
            "Prompt tokens as engines counted them, by model and project (requests made with a key).",
            labels=["model", "project"],
        )
        completion = CounterMetricFamily(
            "llmgw_completion_tokens",
            "Completion tokens as engines counted them, by model and project (requests made with a key).",
            labels=["model", "project"],
        )
        for (model, project), (p, c) in [(k, list(v)) for k, v in list(self._tokens.items())]:
            prompt.add_metric([model, project], p)
            completion.add_metric([model, project], c)
        cost = CounterMetricFamily(
            "llmgw_cost",
            "What requests cost, in the unit prices and budgets are set in, by project.",
            labels=["project"],
        )
        for project, spent in list(self._costs.items()):
            cost.add_metric([project], spent)
        in_flight = GaugeMetricFamily(
            "llmgw_requests_in_flight",
            "Requests an engine is serving now, by the model serving them (a fallback, when one serves).",
            labels=["model"],
        )
        for model, n in list(self.in_flight.items()):
            in_flight.add_metric([model], n)
        return [requests, duration, first_byte, prompt, completion, cost, in_flight]

    def _log(self, call: Call, status: int, started: float, ended: float) -> None:
        key = call.key
        usage = call.usage or (0, 0)
        log.info(
            "request",
            request_id=call.request_id,
            route=call.api.name,
            key=key.prefix if key is not None else "",
            project=key.project_id if key is not None else None,
            model=call.model,
            served_model=call.served_model,
            node=call.route.node_id if call.route is not None else "",
            status=status,
            prompt_tokens=usage[0],
            completion_tokens=usage[1],
            latency_ms=round((ended - started) * 1000, 3),
            ttfb_ms=round((call.first_byte - started) * 1000, 3) if call.first_byte else None,
        )

    def refused(self, scope: str, reason: str) -> None:
        """Admission refused a request: scope is the refusing scope's kind, reason one of a fixed few."""
        self.refusals.labels(scope, reason).inc()

    def upstream_error(self, node: str, stage: str) -> None:
        """An engine did not answer (stage "connect") or stopped mid-reply (stage "reply")."""
        self.upstream_errors.labels(node, stage).inc()


def budget_families(quotas: Quotas) -> Iterable[Metric]:
    """Each budget's amount and what its current period has spent, for alerts before it runs out."""
    amount = GaugeMetricFamily(
        "llmgw_budget_amount",
        "Each budget's amount per period, in the unit prices are set in, by scope kind, scope id and period.",
        labels=["scope", "id", "period"],
    )
    spent = GaugeMetricFamily(
        "llmgw_budget_spent",
        "What the current period of each budget has spent, as admission counts it.",
        labels=["scope", "id", "period"],
    )
    for budget in quotas.budgets:
        labels = [budget.scope.kind, str(budget.scope.id), budget.period]
        amount.add_metric(labels, budget.amount)
        spent.add_metric(labels, quotas.spent(budget.scope) or 0.0)
    yield from (amount, spent)
