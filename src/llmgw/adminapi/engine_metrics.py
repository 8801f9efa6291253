"""Reading a replica's own metrics: the engine's Prometheus page, fetched when an administrator asks.

Every adapter starts its engine with its metrics on (llama.cpp's `--metrics`,
SGLang's `--enable-metrics`) and names where they are served
(`Engine.metrics_path`). The control plane reaches a replica's endpoint the way
the gateway does, so `GET /api/v1/replicas/{shard_id}/metrics` reads that page
on demand and hands it back as numbers: an operator asking why a replica is
slow sees its queue and its tokens per second without logging in to the node.
Nothing is scraped on a timer and nothing is stored; a Prometheus server that
wants history scrapes the same page itself.
"""

from __future__ import annotations

from urllib.parse import urlsplit

import aiohttp
import attrs
from prometheus_client.parser import text_string_to_metric_families

from llmgw.control.inventory import Replica
from llmgw.engines.registry import ENGINES
from llmgw.errors import LlmgwError

# Long enough for an engine busy prefilling a long prompt to answer, short
# enough that an administrator is not left staring at a spinner.
SCRAPE_TIMEOUT_S = 5.0


class ScrapeError(LlmgwError):
    """A replica whose metrics could not be read; the message says why, for a person."""


@attrs.frozen
class Scrape:
    """One reading of a replica's metrics page."""

    url: str
    # Sample name, with its labels as Prometheus writes them, -> value.
    samples: dict[str, float]


async def scrape(replica: Replica, *, secret: str = "", timeout_s: float = SCRAPE_TIMEOUT_S) -> Scrape:
    """Fetch and parse the metrics page of replica's engine, or raise ScrapeError.

    secret is the replica's (Inventory.engine_secret): llama-server wants it on /metrics too.
    """
    engine = ENGINES.get(replica.engine)
    what = f"replica {replica.shard_id} ({replica.engine} on {replica.node_id})"
    if engine is None:
        raise ScrapeError(
            f"{what} runs an engine this server does not know, so where its metrics are is unknown"
        )
    if not replica.endpoint:
        raise ScrapeError(
            f"{what} has no address yet (it is {replica.state}); its metrics come once it is ready"
        )
    url = replica.endpoint.rstrip("/") + engine.metrics_path
    where = urlsplit(replica.endpoint).netloc or replica.endpoint
    try:
        timeout = aiohttp.ClientTimeout(total=timeout_s)
        headers = {"Authorization": f"Bearer {secret}"} if secret else {}
        async with (
            aiohttp.ClientSession(timeout=timeout) as session,
            session.get(url, headers=headers) as resp,
        ):
            if resp.status != 200:
                # llama-server answers 501 on /metrics when it was started without --metrics.
                raise ScrapeError(
                    f"the engine of {what} at {where} answered HTTP {resp.status} on {engine.metrics_path}"
                )
            text = await resp.text()
    except (aiohttp.ClientError, TimeoutError) as exc:
        reason = f"no answer within {timeout_s:g} s" if isinstance(exc, TimeoutError) else str(exc)
        raise ScrapeError(
            f"the engine of {what} at {where} did not answer on {engine.metrics_path}: {reason}"
        ) from None
    try:
        return Scrape(url=url, samples=parse(text))
    except ValueError as exc:
        raise ScrapeError(f"the engine of {what} sent something that is not Prometheus text: {exc}") from None


def parse(text: str) -> dict[str, float]:
    """Prometheus text -> {"name{label="v"}": value}, in the order the page lists them."""
    samples: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(sample.labels.items()))
            samples[f"{sample.name}{{{labels}}}" if labels else sample.name] = float(sample.value)
    return samples
