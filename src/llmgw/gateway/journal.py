"""The usage journal: every recorded request on local disk before its last bytes reach the client.

Usage waits in memory for the writer (usage.py) for up to a second; a server
killed then lost it, though its clients had their replies. Each request's
record is now also copied into a memory-mapped segment file, before the
reply's end goes out: a copy into the page cache, no system call, nothing on
the event loop that waits for the disk. The kernel keeps those pages whatever
happens to the process, so SIGKILL loses nothing; a task fsyncs them every
`usage_sync_s` from a thread, so a power loss loses at most that interval.

Every record has a sequence number, counted by this journal alone, and the
writer's transaction stores the highest one it has added to the store under
the journal's own id (the `journal-id` file, made on first use and kept across
restarts): several servers sharing one PostgreSQL each have a mark of their
own, so no server's progress stands for another's. At start, what the journal
has beyond its mark is replayed into the store, and the last minute of it
rebuilds the rate limits' windows. A segment is deleted once the store has all
of it and its newest request has left the window.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import mmap
import os
import secrets
import struct
import time
import zlib
from collections.abc import AsyncIterator, Iterable
from pathlib import Path

import attrs
import structlog

from llmgw import durable, strictjson
from llmgw.errors import LlmgwError
from llmgw.store.db import Store
from llmgw.store.usage import (
    JournalMark,
    UsageKey,
    UsageTotals,
    add_usage,
    journal_applied,
    shared_journal_mark,
)

log = structlog.get_logger(__name__)

# About 100,000 records; preallocated, so that a page fault never has to find a block.
SEGMENT_BYTES = 16 * 1024 * 1024
_PREFIX, _SUFFIX = "usage-", ".journal"
# The journal's id and the mark it started from, beside its segments (see _Identity).
ID_FILE = "journal-id"
# How long a record stays useful to the rate limits after it is in the store.
_WINDOW_S = 60.0


# A record: the length of its body, the body, the body's CRC-32 and a newline (so that a segment's used
# part ends where its zeros start). The body: the fixed fields, the day, the model's name (UTF-8).
# Binary, not JSON: writing three floats as shortest decimal strings cost more than the rest of a
# request's accounting; packed, the floats are copied as they are, exactly.
_LENGTH = struct.Struct("<I")
# seq, t, key, project, status, prompt and completion tokens, cost, latency, admitted, the day's length
_FIXED = struct.Struct("<QdqqHqqdd?B")
_CRC = struct.Struct("<I")
_TRAILER = 4 + 1  # the CRC and the newline
_END = b"\n"
# A body no record reaches (a model's name is far shorter): a length beyond it is a torn record.
_MAX_BODY = 1 << 16


def _encode(
    seq: int,
    t: float,
    day: str,
    key_id: int,
    project_id: int,
    model: str,
    status: int,
    prompt_tokens: int,
    completion_tokens: int,
    cost: float,
    latency_ms: float,
    admitted: bool,
    names: bytes,
) -> bytes:
    """One record; names is the day and the model's name as _names() encodes them."""
    body = (
        _FIXED.pack(
            seq,
            t,
            key_id,
            project_id,
            status,
            prompt_tokens,
            completion_tokens,
            cost,
            latency_ms,
            admitted,
            len(day),
        )
        + names
    )
    return _LENGTH.pack(len(body)) + body + _CRC.pack(zlib.crc32(body)) + _END


def _names(day: str, model: str) -> bytes:
    # A day is ten ASCII characters (2026-01-31), so its length in characters is its length in bytes.
    return day.encode() + model.encode()


@attrs.frozen
class Entry:
    """One recorded request."""

    seq: int
    t: float  # wall-clock second it was admitted (or refused) at
    day: str  # the UTC day its usage counts on
    key_id: int
    project_id: int
    model: str
    status: int
    prompt_tokens: int
    completion_tokens: int
    cost: float
    latency_ms: float
    admitted: bool  # it passed admission: it holds a place in its scopes' windows

    def encode(self) -> bytes:
        return _encode(
            self.seq,
            self.t,
            self.day,
            self.key_id,
            self.project_id,
            self.model,
            self.status,
            self.prompt_tokens,
            self.completion_tokens,
            self.cost,
            self.latency_ms,
            self.admitted,
            _names(self.day, self.model),
        )


def _decode(data: bytes) -> tuple[list[Entry], int]:
    """The whole records in data: up to one cut short (its server died while writing it; nothing after
    it was written) or the zeros of the unused part; and how many records were damaged. A record whose
    bytes were damaged but whose frame holds is skipped, not charged as other numbers."""
    if data[:1] == b"[" and data[1:2].isdigit():
        # A segment the previous release wrote (a JSON array a line): a binary record's length has a
        # zero second byte, never a digit. Replayed, so an upgrade after a crash loses no usage.
        return _decode_json_lines(data), 0
    entries: list[Entry] = []
    damaged = 0
    at = 0
    while at + _LENGTH.size <= len(data):
        (length,) = _LENGTH.unpack_from(data, at)
        body_at = at + _LENGTH.size
        end = body_at + length + _TRAILER
        if not _FIXED.size <= length <= _MAX_BODY or end > len(data) or data[end - 1 : end] != _END:
            break
        body = data[body_at : body_at + length]
        at = end
        if _CRC.unpack_from(data, body_at + length)[0] != zlib.crc32(body):
            damaged += 1
            continue
        fields = _FIXED.unpack_from(body)
        day_end = _FIXED.size + fields[-1]
        try:
            day, model = body[_FIXED.size : day_end].decode(), body[day_end:].decode()
        except UnicodeDecodeError:
            damaged += 1
            continue
        seq, t, key_id, project_id, status, prompt, completion, cost, latency, admitted, _ = fields
        entries.append(
            Entry(seq, t, day, key_id, project_id, model, status, prompt, completion, cost, latency, admitted)
        )
    return entries, damaged


def _decode_json_lines(data: bytes) -> list[Entry]:
    entries: list[Entry] = []
    for line in data.split(b"\x00", 1)[0].splitlines():
        try:
            entries.append(Entry(*json.loads(line)))
        except (ValueError, TypeError):
            continue  # the line a killed server was writing
    return entries


@attrs.define
class _Segment:
    path: Path
    fd: int
    mm: mmap.mmap
    used: int = 0
    synced: int = 0
    last_seq: int = 0
    last_t: float = 0.0


def _create(path: Path) -> _Segment:
    """A new, preallocated segment, its name already on disk. In a thread: it waits for the disk."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.posix_fallocate(fd, 0, SEGMENT_BYTES)
        mm = mmap.mmap(fd, SEGMENT_BYTES)
        durable.sync_directory(path.parent)
    except BaseException:
        os.close(fd)
        raise
    return _Segment(path, fd, mm)


def _read(directory: Path) -> tuple[list[tuple[Path, list[Entry]]], int]:
    """Every segment, oldest first, with the whole entries in it; and how many records were damaged.
    In a thread."""
    directory.mkdir(parents=True, exist_ok=True)
    paths = sorted(p for p in directory.iterdir() if p.name.startswith(_PREFIX) and p.name.endswith(_SUFFIX))
    segments: list[tuple[Path, list[Entry]]] = []
    damaged = 0
    for path in paths:
        entries, bad = _decode(path.read_bytes())
        segments.append((path, entries))
        damaged += bad
    return segments, damaged


@attrs.frozen
class _Identity:
    """Who a journal is to the store: its id, and the mark it started from.

    base: the highest record the store had when the journal got its id, kept for as long as the
    store has no mark of the journal's own. 0 for a new journal; the shared mark of the releases before
    migration 9 for a journal one of them wrote (migrations.py says why). Written with the id, before
    any row names the journal, so that a start that dies in between starts from the same place again.
    """

    journal_id: str
    base: int


def _read_identity(directory: Path) -> _Identity | None:
    """The journal's identity; None for a journal that has none yet. In a thread."""
    path = directory / ID_FILE
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    try:
        fields = json.loads(text)
        return _Identity(str(fields["id"]), int(fields["base"]))
    except (ValueError, TypeError, KeyError) as exc:
        # A new id would replay every record the store already has under the old one.
        raise LlmgwError(
            f"the usage journal's id file {path} is damaged ({exc}); to start a new journal, move "
            f"{directory} aside (what it holds that the store lacks is then not counted)"
        ) from None


def _write_identity(directory: Path, identity: _Identity) -> None:
    """Write the identity, whole or not at all, and on disk before anything names it. In a thread."""
    data = strictjson.dumps({"id": identity.journal_id, "base": identity.base})
    durable.write_atomically(directory / ID_FILE, data)


async def _identity(directory: Path, store: Store, has_records: bool) -> _Identity:
    identity = await asyncio.to_thread(_read_identity, directory)
    if identity is None:
        # A journal with records and no id was written by a release before migration 9.
        base = await shared_journal_mark(store) if has_records else 0
        identity = _Identity(secrets.token_hex(8), base)
        await asyncio.to_thread(_write_identity, directory, identity)
        log.info("the usage journal has an id of its own now", journal=identity.journal_id, base=base)
    return identity


def _new_path(directory: Path) -> Path:
    # Named by when it was made: a segment is always made before the one that follows it is used.
    return directory / f"{_PREFIX}{time.time_ns():020d}{_SUFFIX}"


class Journal:
    """Appends records to the current segment; its task syncs, rotates and deletes segments."""

    def __init__(
        self,
        journal_id: str,
        directory: Path,
        sync_s: float,
        current: _Segment,
        old: list[tuple[Path, int, float]],
        next_seq: int,
    ) -> None:
        self.journal_id = journal_id
        self._directory = directory
        self._sync_s = sync_s
        # Segments of earlier runs: (path, last seq, last wall time), deleted when no longer needed.
        self._old = old
        self._next_seq = next_seq
        self._names: dict[tuple[str, str], bytes] = {}
        self._current = current
        self._spare: _Segment | None = None
        self._full: list[_Segment] = []  # retired, to be synced, closed and later deleted
        self._applied = 0
        self._stopping = asyncio.Event()

    @property
    def next_seq(self) -> int:
        return self._next_seq

    def append(
        self,
        t: float,
        day: str,
        key_id: int,
        project_id: int,
        model: str,
        status: int,
        prompt_tokens: int,
        completion_tokens: int,
        cost: float,
        latency_ms: float,
        admitted: bool,
    ) -> int:
        """Copy one request's record into the current segment; its sequence number. No system call (but
        when a segment fills without a spare ready, which the sync task prevents at any rate a server
        reaches). On every request's path: no Entry is made, and a day's and model's names are encoded
        once."""
        seq = self._next_seq
        names = self._names.get((day, model))
        if names is None:
            if len(self._names) > 1024:
                self._names.clear()
            names = self._names[(day, model)] = _names(day, model)
        data = _encode(
            seq,
            t,
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
            names,
        )
        segment = self._current
        if segment.used + len(data) > SEGMENT_BYTES:
            segment = self._rotate()
        segment.mm[segment.used : segment.used + len(data)] = data
        segment.used += len(data)
        segment.last_seq = seq
        segment.last_t = t
        self._next_seq = seq + 1
        return seq

    def mark(self, seq: int) -> JournalMark:
        """What a write covering the records up to seq stores with its usage."""
        return JournalMark(self.journal_id, seq)

    async def stored(self, store: Store) -> int:
        """The highest of this journal's records the store has."""
        applied = await journal_applied(store, self.journal_id)
        return self._applied if applied is None else applied

    def applied(self, seq: int) -> None:
        """The store has every record up to seq."""
        self._applied = max(self._applied, seq)

    def _rotate(self) -> _Segment:
        self._full.append(self._current)
        spare, self._spare = self._spare, None
        if spare is None:
            # Blocks the loop for a moment; the sync task keeps a spare, so only a burst of more than
            # a segment's worth of requests within one sync interval comes here.
            spare = _create(_new_path(self._directory))
        self._current = spare
        return spare

    def stop(self) -> None:
        """Ask the task to sync once more and close."""
        self._stopping.set()

    async def run(self) -> None:
        """Sync every interval, keep a spare segment, delete what is no longer needed; until stop()."""
        try:
            while True:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(self._sync_s):
                        await self._stopping.wait()
                last = self._stopping.is_set()
                try:
                    await self._sync()
                    if not last:
                        await self._tidy()
                except OSError as exc:
                    log.error("could not sync the usage journal to disk; trying again", error=str(exc))
                if last:
                    return
        finally:
            self.close()

    def close(self) -> None:
        """Unmap and close every segment; what was copied stays in the page cache for the kernel."""
        segments = [*self._full, self._current, self._spare]
        self._full, self._spare = [], None
        for segment in segments:
            if segment is not None and not segment.mm.closed:
                segment.mm.close()
                os.close(segment.fd)

    async def _sync(self) -> None:
        for segment in [*self._full, self._current]:
            if segment.synced < segment.used:
                used = segment.used
                await asyncio.to_thread(os.fsync, segment.fd)
                segment.synced = used

    async def _tidy(self) -> None:
        if self._spare is None:
            self._spare = await asyncio.to_thread(_create, _new_path(self._directory))
        edge = time.time() - _WINDOW_S
        for path, last_seq, last_t in list(self._old):
            if last_seq <= self._applied and last_t < edge:
                await asyncio.to_thread(path.unlink, missing_ok=True)
                self._old.remove((path, last_seq, last_t))
        for segment in list(self._full):
            if segment.synced == segment.used and segment.last_seq <= self._applied and segment.last_t < edge:
                self._full.remove(segment)
                segment.mm.close()
                os.close(segment.fd)
                await asyncio.to_thread(segment.path.unlink, missing_ok=True)


def _totals(entries: Iterable[Entry]) -> dict[UsageKey, UsageTotals]:
    batch: dict[UsageKey, UsageTotals] = {}
    for e in entries:
        totals = batch.setdefault(UsageKey(e.day, e.key_id, e.project_id, e.model, e.status), UsageTotals())
        totals.requests += 1
        totals.prompt_tokens += e.prompt_tokens
        totals.completion_tokens += e.completion_tokens
        totals.cost += e.cost
        totals.latency_ms += e.latency_ms
    return batch


@contextlib.asynccontextmanager
async def open_journal(
    directory: Path, store: Store, sync_s: float
) -> AsyncIterator[tuple[Journal, list[Entry]]]:
    """The journal in directory, with what it held replayed into the store; yields it and the entries of
    the last minute (for the rate limits' windows). Run journal.run() while it is open."""
    segments, damaged = await asyncio.to_thread(_read, directory)
    entries = [e for _, found in segments for e in found]
    identity = await _identity(directory, store, bool(entries))
    stored = await journal_applied(store, identity.journal_id)
    applied = identity.base if stored is None else stored
    if damaged:
        log.warning("the usage journal had damaged records; they are not counted", damaged_records=damaged)
    missing = [e for e in entries if e.seq > applied]
    if missing:
        # One transaction with the new mark: replayed once, even if this start dies too.
        last = max(e.seq for e in missing)
        await add_usage(store, _totals(missing).items(), JournalMark(identity.journal_id, last))
        log.warning(
            "replayed usage the store did not have yet from the journal (the server stopped before "
            "writing it there)",
            replayed_records=len(missing),
            journal=identity.journal_id,
        )
        applied = last
    else:
        log.info(
            "replayed no usage: the store has every record of the usage journal",
            replayed_records=0,
            journal=identity.journal_id,
        )
    old = [
        (path, max((e.seq for e in found), default=0), max((e.t for e in found), default=0.0))
        for path, found in segments
    ]
    next_seq = max([applied, *(e.seq for e in entries)]) + 1
    current = await asyncio.to_thread(_create, _new_path(directory))
    journal = Journal(identity.journal_id, directory, sync_s, current, old, next_seq)
    journal.applied(applied)
    edge = time.time() - _WINDOW_S
    try:
        yield journal, [e for e in entries if e.t > edge]
    finally:
        journal.close()
