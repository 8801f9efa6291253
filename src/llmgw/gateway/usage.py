"""Usage: read from the engine's reply as it passes, added up in memory, written in batches.

No request writes to the database: `UsageRecorder.record` adds to a dict (and
copies a record into the usage journal, journal.py, which survives the
process) and one writer task moves the totals into the store every second, and
once more when the server stops.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta

import structlog

from llmgw.backoff import ExponentialBackoff
from llmgw.errors import StoreError
from llmgw.gateway.apis import reply_usage
from llmgw.gateway.journal import Journal
from llmgw.store.base import NotCommitted
from llmgw.store.db import Store
from llmgw.store.usage import UsageKey, UsageTotals, add_usage

log = structlog.get_logger(__name__)

_USAGE = b'"usage"'
_DECODER = json.JSONDecoder()
# How far past '"usage"' its object may reach; OpenAI's is under 300 bytes
# even with its token details.
_USAGE_SPAN = 2048
# How much of a stream's end is kept to find the usage in: its last event
# (`stream_options.include_usage`) and `data: [DONE]`, with room to spare.
STREAM_TAIL = 8192
# After a failed write, the next try waits longer each time, up to 15 s: a store that is down is not
# asked every second, and one that is back sees the usage within 15 s. Nothing is lost meanwhile (the
# totals wait in memory, each request's record in the journal).
_RETRY = ExponentialBackoff(base_s=1.0, cap_s=15.0, jitter=0.2)


def find_usage(data: bytes | bytearray) -> tuple[int, int] | None:
    """(prompt, completion) tokens of the last non-null "usage" in a reply or a stream's tail.

    In whichever API's names it is given (apis.reply_usage).

    Searched from the end, so a stream whose every chunk says `"usage":null`
    costs one search. An escaped "usage" inside generated text reads
    `\\"usage\\"` and never matches.
    """
    end = len(data)
    while (at := data.rfind(_USAGE, 0, end)) >= 0:
        end = at
        text = bytes(data[at + len(_USAGE) : at + _USAGE_SPAN]).decode("utf-8", "replace").lstrip()
        if not text.startswith(":"):
            continue
        try:
            value, _ = _DECODER.raw_decode(text[1:].lstrip())
        except ValueError:
            continue
        if isinstance(value, dict) and (found := reply_usage(value)) is not None:
            return found
    return None


class UsageRecorder:
    """Totals per day, key, project, model and status, waiting for the writer."""

    def __init__(self, interval_s: float = 1.0, journal: Journal | None = None) -> None:
        self._interval_s = interval_s
        # None: nothing survives the process (tests of what is counted, not of what is kept).
        self._journal = journal
        self._seq = 0  # the last journal record among the pending totals
        self._pending: dict[UsageKey, UsageTotals] = {}
        # A batch whose write failed after it may have committed (the connection to PostgreSQL died
        # around its COMMIT), with the last journal record it covers: this journal's own mark in the
        # store says whether it landed, and it is added again only if it did not. Counted as pending
        # meanwhile. A write that failed before its COMMIT was sent is never here: it goes straight back.
        self._unsure: tuple[int, dict[UsageKey, UsageTotals]] | None = None
        self._stopping = asyncio.Event()
        self._day = ""
        self._day_ends = 0.0
        # Held while a batch moves to the store, so that whoever reads the
        # store and the pending totals together (budgets, at refresh) never
        # sees a batch in both or in neither.
        self.lock = asyncio.Lock()
        # For the metrics page: when the writer last emptied the pending totals (time.monotonic()),
        # and how many rows its last batch wrote. Set by the writer only; nothing on the request path.
        self._written_at = time.monotonic()
        self.last_batch = 0

    def lag(self, now: float) -> float:
        """Seconds since usage was last written while some is waiting; 0 when none is."""
        return max(now - self._written_at, 0.0) if self._pending or self._unsure else 0.0

    def _today(self) -> str:
        now = time.time()
        if now >= self._day_ends:
            today = datetime.fromtimestamp(now, UTC).date()
            self._day = today.isoformat()
            self._day_ends = datetime.combine(today + timedelta(days=1), datetime.min.time(), UTC).timestamp()
        return self._day

    def record(
        self,
        key_id: int,
        project_id: int,
        model: str,
        status: int,
        prompt_tokens: int,
        completion_tokens: int,
        cost: float,
        latency_ms: float,
        *,
        admitted: bool = True,
        at: float | None = None,
    ) -> None:
        """Add one request; no I/O. admitted: it passed admission (a refusal did not), at the wall-clock
        second at (now when None)."""
        day = self._today()
        if self._journal is not None:
            self._seq = self._journal.append(
                time.time() if at is None else at,
                day,
                key_id,
                project_id,
                model,
                status,
                prompt_tokens,
                completion_tokens,
                cost,
                latency_ms,
                admitted,
            )
        key = UsageKey(day, key_id, project_id, model, status)
        totals = self._pending.get(key)
        if totals is None:
            totals = self._pending[key] = UsageTotals()
        totals.requests += 1
        totals.prompt_tokens += prompt_tokens
        totals.completion_tokens += completion_tokens
        totals.cost += cost
        totals.latency_ms += latency_ms

    def pending(self) -> Iterable[tuple[UsageKey, UsageTotals]]:
        """What is counted but not yet in the store."""
        unsure = list(self._unsure[1].items()) if self._unsure is not None else []
        return [*self._pending.items(), *unsure]

    async def flush(self, store: Store) -> int:
        """Move every pending total into the store in one transaction; how many requests it wrote."""
        async with self.lock:
            await self._settle(store)
            if not self._pending:
                self._written_at = time.monotonic()
                return 0
            batch, self._pending = self._pending, {}
            seq = self._seq
            try:
                await add_usage(store, batch.items(), self._journal.mark(seq) if self._journal else None)
            except NotCommitted:
                # Certainly not in the store: back into pending, so that the next flush tries again
                # and the gateway's budgets keep counting it.
                self._merge(batch)
                raise
            except BaseException:
                if self._journal is not None:
                    self._unsure = (seq, batch)
                else:
                    self._merge(batch)
                raise
            if self._journal is not None:
                self._journal.applied(seq)
            self._written_at = time.monotonic()
            self.last_batch = len(batch)
            return sum(t.requests for t in batch.values())

    async def _settle(self, store: Store) -> None:
        """Decide a batch whose write may have committed, by this journal's own mark in the store."""
        if self._unsure is None or self._journal is None:
            return
        unsure_seq, unsure = self._unsure
        if await self._journal.stored(store) < unsure_seq:
            self._merge(unsure)
        else:
            self._journal.applied(unsure_seq)
            log.info(
                "a usage batch whose write failed at its commit was in the store after all; not written "
                "again",
                requests=sum(t.requests for t in unsure.values()),
                totals=len(unsure),
            )
        self._unsure = None

    def _merge(self, batch: dict[UsageKey, UsageTotals]) -> None:
        for key, totals in batch.items():
            into = self._pending.setdefault(key, UsageTotals())
            into.requests += totals.requests
            into.prompt_tokens += totals.prompt_tokens
            into.completion_tokens += totals.completion_tokens
            into.cost += totals.cost
            into.latency_ms += totals.latency_ms

    def stop(self) -> None:
        """Ask the writer to flush once more and return."""
        self._stopping.set()

    async def run(self, store: Store) -> None:
        """The writer: flush every interval until stop(), then a last time.

        Stopped by stop() rather than by cancellation: a flush cancelled while
        its COMMIT is on its way (in aiosqlite's thread, or to PostgreSQL) cannot know whether it landed.
        """
        failures = 0
        while True:
            wait = self._interval_s if not failures else _RETRY.delay(failures)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(wait):
                    await self._stopping.wait()
            last = self._stopping.is_set()
            try:
                written = await self.flush(store)
            except Exception as exc:
                failures += 1
                # Once per outage, in a sentence: a store that is away for minutes (a PostgreSQL
                # restarted, failed over) would otherwise print a traceback every second.
                if failures == 1 or last:
                    kept = len(self._pending) + (len(self._unsure[1]) if self._unsure else 0)
                    if isinstance(exc, StoreError):
                        log.warning(
                            "could not write usage to the store; it is kept in memory and in the usage "
                            "journal, and written when the store answers again"
                            if not last
                            else "could not write usage to the store before stopping; the usage "
                            "journal keeps it, and the next start writes it",
                            error=str(exc),
                            totals_waiting=kept,
                        )
                    else:
                        log.exception("could not write usage to the store; keeping it to try again")
            else:
                if failures:
                    log.info("usage written to the store again", failed_tries=failures, requests=written)
                failures = 0
            if last:
                return
