"""The history charts on the cluster and models pages, drawn from the gateway's sampled rings."""

from __future__ import annotations

from collections.abc import Iterable

from aiohttp import web
from markupsafe import Markup

from llmgw.gateway.history import ALL, History
from llmgw.web.chart import Series, colour, small_lines

HISTORY_KEY = web.AppKey("llmgw.web.history", History)


def _span(seconds: float) -> str:
    if seconds >= 3600:
        return f"last {seconds / 3600:.2g} h"
    return f"last {max(round(seconds / 60), 1)} min"


def model_charts(history: History, model: str = ALL) -> list[Markup]:
    """Requests, tokens, p50/p95 latency and 5xx per second of one model (ALL: of every model together)."""
    points = history.model(model)
    if not points:
        return []
    times = [p.at for p in points]
    span = _span(times[-1] - times[0] + history.interval_s)
    return [
        small_lines(
            "requests/s", times, [(Series("now", colour(0)), [p.requests_per_s for p in points])], span=span
        ),
        small_lines("tokens/s", times, [(Series("now", colour(0)), [p.tokens_per_s for p in points])]),
        small_lines(
            "latency",
            times,
            [
                (Series("p50", colour(0)), [p.p50_s for p in points]),
                (Series("p95", colour(1)), [p.p95_s for p in points]),
            ],
            unit="s",
        ),
        small_lines("5xx/s", times, [(Series("now", colour(5)), [p.errors_per_s for p in points])]),
    ]


def gpu_charts(history: History, nodes: Iterable[str]) -> list[Markup]:
    """GPU memory in use against the total, per node of nodes that has GPUs."""
    charts = []
    for node, points in history.gpu_memory(nodes).items():
        times = [p.at for p in points]
        charts.append(
            small_lines(
                f"GPU memory, {node}",
                times,
                [
                    (Series("used", colour(0)), [float(p.used_mb) for p in points]),
                    (Series("of", colour(7)), [float(p.total_mb) for p in points]),
                ],
                unit="MB",
            )
        )
    return charts
