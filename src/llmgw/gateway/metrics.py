"""The gateway's Prometheus series, and the pipeline stages that count a request once it is over.

Label values are bounded so that no client can grow the series without end: a
model is one the catalog serves (the empty string for a name it does not), a
project is its id, an error code is one of the gateway's own, a node is one
that registered. Each label combination's child is looked up once and kept,
so that counting a request costs dictionary lookups and prometheus-client's
own increments, never a `labels()` call on the request path.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import Iterable

import structlog
from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.metrics_core import Metric

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


def request_id(request: web.Request) -> str:
    """The client's x-request-id when it sent a usable one, else a fresh one."""
    sent = request.headers.get(REQUEST_ID_HEADER)
    if sent and len(sent) <= _MAX_REQUEST_ID and sent.isascii() and sent.isprintable():
        return sent
    return secrets.token_hex(12)


class GatewayMetrics:
    """The gateway's series in one registry, with their children cached by label values."""

    def __init__(self, registry: CollectorRegistry, catalog: Catalog, *, log_requests: bool = False) -> None:
        # The live catalog: what makes a model name a label value rather than a client's free text.
        self._catalog = catalog
        self._log_requests = log_requests
        self.requests = Counter(
            "llmgw_requests",
            "Requests the gateway answered, by model asked for, model that served it, project, "
            "status class and error code.",
            ["model", "served_model", "project", "status", "code"],
            registry=registry,
        )
        self.duration = Histogram(
            "llmgw_request_duration_seconds",
            "Time from a request's arrival to the end of its reply, by model.",
            ["model"],
            buckets=LATENCY_BUCKETS_S,
            registry=registry,
        )
        self.first_byte = Histogram(
            "llmgw_time_to_first_byte_seconds",
            "Time from a request's arrival to the first bytes of its engine's reply, by model.",
            ["model"],
            buckets=LATENCY_BUCKETS_S,
            registry=registry,
        )
        self.prompt_tokens = Counter(
            "llmgw_prompt_tokens",
            "Prompt tokens as engines counted them, by model and project (requests made with a key).",
            ["model", "project"],
            registry=registry,
        )
        self.completion_tokens = Counter(
            "llmgw_completion_tokens",
            "Completion tokens as engines counted them, by model and project (requests made with a key).",
            ["model", "project"],
            registry=registry,
        )
        self.cost = Counter(
            "llmgw_cost",
            "What requests cost, in the unit prices and budgets are set in, by project.",
            ["project"],
            registry=registry,
        )
        self.in_flight = Gauge(
            "llmgw_requests_in_flight",
            "Requests being served now, by model.",
            ["model"],
            registry=registry,
        )
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
        self._requests: dict[tuple[str, str, str, str, str], Counter] = {}
        self._per_model: dict[str, tuple[Histogram, Histogram]] = {}
        self._tokens: dict[tuple[str, str], tuple[Counter, Counter]] = {}
        self._costs: dict[str, Counter] = {}
        self._in_flight: dict[str, Gauge] = {}

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
            self._count(call, started, status, code)

    async def track_in_flight(self, call: Call, rest: Handler) -> web.StreamResponse:
        """The stage after read_request (the model is known): counts the request in flight by model."""
        model = call.model
        gauge = self._in_flight.get(model)
        if gauge is None:
            gauge = self._in_flight[model] = self.in_flight.labels(self._model(model))
        gauge.inc()
        try:
            return await rest(call)
        finally:
            gauge.dec()

    def _count(self, call: Call, started: float, status: int, code: str) -> None:
        now = time.perf_counter()
        model, served = call.model, call.served_model
        project = str(call.key.project_id) if call.key is not None else ""
        status_class = _STATUS_CLASSES.get(status // 100, "5xx")
        key = (model, served, project, status_class, code)
        counter = self._requests.get(key)
        if counter is None:
            counter = self._requests[key] = self.requests.labels(
                self._model(model), self._model(served), project, status_class, code
            )
        counter.inc()
        timings = self._per_model.get(model)
        if timings is None:
            label = self._model(model)
            timings = self._per_model[model] = (self.duration.labels(label), self.first_byte.labels(label))
        timings[0].observe(now - started)
        if call.first_byte:
            timings[1].observe(call.first_byte - started)
        usage = call.usage
        if usage is not None:
            tokens = self._tokens.get((model, project))
            if tokens is None:
                label = self._model(model)
                tokens = self._tokens[(model, project)] = (
                    self.prompt_tokens.labels(label, project),
                    self.completion_tokens.labels(label, project),
                )
            tokens[0].inc(usage[0])
            tokens[1].inc(usage[1])
        if call.cost:
            cost = self._costs.get(project)
            if cost is None:
                cost = self._costs[project] = self.cost.labels(project)
            cost.inc(call.cost)
        if self._log_requests:
            self._log(call, status, started, now)

    def _log(self, call: Call, status: int, started: float, ended: float) -> None:
        key = call.key
        usage = call.usage or (0, 0)
        log.info(
            "request",
            request_id=call.request_id,
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
