"""The usage journal: what a dead server journaled reaches the store once, and refills the windows."""

from __future__ import annotations

import asyncio
import json
import os
import stat
import time
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

from llmgw.errors import StoreError
from llmgw.gateway import usage as usage_module
from llmgw.gateway.errors import ApiError
from llmgw.gateway.journal import ID_FILE, Entry, Journal, open_journal
from llmgw.gateway.quotas import Quotas
from llmgw.gateway.usage import UsageRecorder
from llmgw.store import Store, open_store
from llmgw.store.base import NotCommitted
from llmgw.store.keys import create_key
from llmgw.store.migrations import MIGRATIONS
from llmgw.store.quotas import set_budget, set_limits
from llmgw.store.scopes import Scope
from llmgw.store.usage import UsageKey, UsageTotals, add_usage, usage_by_day

from ..waiting import eventually


async def _totals(store: Store) -> tuple[int, int, int, float]:
    rows = await usage_by_day(store)
    return (
        sum(r.requests for r in rows),
        sum(r.prompt_tokens for r in rows),
        sum(r.completion_tokens for r in rows),
        sum(r.cost for r in rows),
    )


def _record(recorder: UsageRecorder, n: int, *, key_id: int = 1, status: int = 200) -> None:
    for _ in range(n):
        recorder.record(key_id, 1, "m", status, 10, 5, 0.25, 3.0)


def _segments(directory: Path) -> list[Path]:
    return [p for p in directory.iterdir() if p.name != ID_FILE]


def _die(journal: Journal) -> None:
    """What SIGKILL leaves: the journal's pages, nothing of the process's memory, no last flush."""
    del journal


class TestReplay:
    async def test_usage_journaled_but_never_written_is_replayed_into_the_store_once(
        self, store: Store, tmp_path: Path
    ) -> None:
        async with open_journal(tmp_path / "j", store, 1.0) as (journal, _):
            recorder = UsageRecorder(journal=journal)
            _record(recorder, 7)
            _die(journal)
        assert await _totals(store) == (0, 0, 0, 0.0)
        async with open_journal(tmp_path / "j", store, 1.0) as (journal, _):
            pass
        assert await _totals(store) == (7, 70, 35, pytest.approx(1.75))
        # A third start replays nothing again.
        async with open_journal(tmp_path / "j", store, 1.0) as (journal, _):
            pass
        assert await _totals(store) == (7, 70, 35, pytest.approx(1.75))

    async def test_what_the_writer_already_wrote_is_not_replayed_again(
        self, store: Store, tmp_path: Path
    ) -> None:
        async with open_journal(tmp_path / "j", store, 1.0) as (journal, _):
            recorder = UsageRecorder(journal=journal)
            _record(recorder, 3)
            await recorder.flush(store)
            _record(recorder, 2)
            _die(journal)
        async with open_journal(tmp_path / "j", store, 1.0) as (journal, _):
            recorder = UsageRecorder(journal=journal)
            _record(recorder, 1)
            await recorder.flush(store)
        assert (await _totals(store))[0] == 6

    async def test_a_record_cut_short_by_the_crash_is_skipped(self, store: Store, tmp_path: Path) -> None:
        async with open_journal(tmp_path / "j", store, 1.0) as (journal, _):
            recorder = UsageRecorder(journal=journal)
            _record(recorder, 2)
        (segment,) = sorted((tmp_path / "j").iterdir())[-1:]
        data = bytearray(segment.read_bytes())
        end = len(data.rstrip(b"\0"))
        torn = Entry(99, time.time(), "2026-01-01", 1, 1, "m", 200, 1, 1, 0.0, 1.0, True).encode()
        data[end : end + 20] = torn[:20]
        segment.write_bytes(bytes(data))
        async with open_journal(tmp_path / "j", store, 1.0) as (journal, _):
            assert journal.next_seq == 3
        assert (await _totals(store))[0] == 2

    async def test_a_record_whose_bytes_were_damaged_is_not_replayed_as_other_numbers(
        self, store: Store, tmp_path: Path
    ) -> None:
        async with open_journal(tmp_path / "j", store, 1.0) as (journal, _):
            recorder = UsageRecorder(journal=journal)
            _record(recorder, 3)
            _die(journal)
        (segment,) = sorted((tmp_path / "j").iterdir())[-1:]
        data = bytearray(segment.read_bytes())
        # A byte of the second record's token counts, as a bad sector or a stray write leaves it.
        second = len(Entry(1, time.time(), "2026-01-01", 1, 1, "m", 200, 10, 5, 0.25, 3.0, True).encode())
        data[second + 40] ^= 0x10
        segment.write_bytes(bytes(data))
        async with open_journal(tmp_path / "j", store, 1.0) as (journal, _):
            pass
        # The damaged one skipped, the others replayed: a budget is never charged numbers no request used.
        assert await _totals(store) == (2, 20, 10, pytest.approx(0.5))

    async def test_a_segment_the_previous_release_wrote_as_json_lines_is_replayed(
        self, store: Store, tmp_path: Path
    ) -> None:
        """An upgrade straight after a crash: its journal is in the older format, and still counts."""
        directory = tmp_path / "j"
        directory.mkdir()
        now = time.time()
        lines = b"".join(
            json.dumps([seq, now, "2026-01-01", 1, 1, "m", 200, 10, 5, 0.25, 3.0, True]).encode() + b"\n"
            for seq in (1, 2)
        )
        # The line a killed server was writing, then the segment's unused zeros.
        (directory / "usage-00000000000000000001.journal").write_bytes(lines + b"[3,17" + bytes(4096))
        async with open_journal(directory, store, 1.0) as (journal, _):
            assert journal.next_seq == 3
        assert await _totals(store) == (2, 20, 10, pytest.approx(0.5))

    async def test_the_sync_task_rotates_segments_and_deletes_those_the_store_has(
        self, store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        monkeypatch.setattr("llmgw.gateway.journal.SEGMENT_BYTES", 4096)
        monkeypatch.setattr("llmgw.gateway.journal._WINDOW_S", 0.0)
        directory = tmp_path / "j"
        async with open_journal(directory, store, 0.01) as (journal, _), asyncio.TaskGroup() as tasks:
            tasks.create_task(journal.run())
            recorder = UsageRecorder(journal=journal)
            # About 30 records to a 4 KiB segment.
            _record(recorder, 200)
            assert len(_segments(directory)) > 3
            await recorder.flush(store)
            # What is left: the segment in use and a spare.
            await eventually(lambda: len(_segments(directory)) <= 2)
            journal.stop()
        async with open_journal(directory, store, 1.0) as (journal, _):
            assert journal.next_seq == 201
        assert (await _totals(store))[0] == 200


class TestDurability:
    async def test_the_sync_task_fsyncs_the_segment_records_were_appended_to(
        self, store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """An fsync replaced with a no-op passed every other test: the journal only reached the page cache."""
        synced: list[int] = []
        real_fsync = os.fsync

        def recording_fsync(fd: int) -> None:
            synced.append(fd)
            real_fsync(fd)

        monkeypatch.setattr(os, "fsync", recording_fsync)
        directory = tmp_path / "j"
        async with open_journal(directory, store, 0.01) as (journal, _), asyncio.TaskGroup() as tasks:
            recorder = UsageRecorder(journal=journal)
            _record(recorder, 3)
            segment = journal._current
            synced.clear()
            tasks.create_task(journal.run())
            await eventually(lambda: segment.fd in synced and segment.synced == segment.used)
            journal.stop()

    async def test_the_journal_id_and_each_segment_s_name_are_synced_before_they_are_relied_on(
        self, store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """The id file's fsync and the directory's, made no-ops, passed every other test.

        A power loss could then lose the id the store's mark is kept under (the next start would
        take a new one and replay what the store has), or a segment's name with its records.
        """
        directory = tmp_path / "j"
        # Each fsync: a directory or not, the inode synced, the names in the journal's directory then.
        synced: list[tuple[bool, int, set[str]]] = []
        real_fsync = os.fsync

        def recording_fsync(fd: int) -> None:
            status = os.fstat(fd)
            synced.append((stat.S_ISDIR(status.st_mode), status.st_ino, set(os.listdir(directory))))
            real_fsync(fd)

        monkeypatch.setattr(os, "fsync", recording_fsync)
        async with open_journal(directory, store, 1.0) as (journal, _):
            segment = journal._current.path.name
        id_file = (directory / ID_FILE).stat().st_ino
        folder = directory.stat().st_ino
        # The id's bytes, before the rename gave them its name; then that name, before any segment
        # exists (the store names the journal before the first segment is made).
        file_synced = [i for i, (is_dir, ino, _) in enumerate(synced) if not is_dir and ino == id_file]
        named = [
            i
            for i, (is_dir, ino, names) in enumerate(synced)
            if is_dir and ino == folder and names == {ID_FILE}
        ]
        assert file_synced and ID_FILE not in synced[file_synced[0]][2]
        assert named and file_synced[0] < named[0]
        # The segment's name is synced once it exists, before a record is copied into it.
        assert any(is_dir and ino == folder and segment in names for is_dir, ino, names in synced)


class TestAcrossARestart:
    async def test_a_budget_counts_what_was_spent_before_a_crash(self, store: Store, tmp_path: Path) -> None:
        await set_budget(store, Scope("key", 1), 1.0, "total")
        async with open_journal(tmp_path / "j", store, 1.0) as (journal, _):
            recorder = UsageRecorder(journal=journal)
            _record(recorder, 3)
            _die(journal)
        async with open_journal(tmp_path / "j", store, 1.0) as (journal, _):
            recorder = UsageRecorder(journal=journal)
            quotas = Quotas(recorder)
            await quotas.refresh(store)
            assert quotas.spent(Scope("key", 1)) == pytest.approx(0.75)

    @pytest.mark.parametrize("clean", [False, True], ids=["killed", "stopped"])
    async def test_rate_limit_windows_do_not_reset_to_empty_after_a_restart(
        self, store: Store, tmp_path: Path, clean: bool
    ) -> None:
        _, key = await create_key(store, "k")
        await set_limits(store, Scope("project", 1), rpm=3, tpm=None)
        async with open_journal(tmp_path / "j", store, 1.0) as (journal, _):
            recorder = UsageRecorder(journal=journal)
            quotas = Quotas(recorder)
            await quotas.refresh(store)
            for _ in range(3):
                ticket = quotas.admit(key, 15, 0.0)
                quotas.settle(ticket, 15, 0.0)
                recorder.record(key.id, 1, "m", 200, 10, 5, 0.0, 1.0)
            if clean:
                # A clean stop: everything written to the store, the journal synced and closed.
                await recorder.flush(store)
                journal.stop()
                await journal.run()
            else:
                _die(journal)
        async with open_journal(tmp_path / "j", store, 1.0) as (journal, recent):
            quotas = Quotas(UsageRecorder(journal=journal))
            await quotas.refresh(store)
            quotas.restore(recent)
            with pytest.raises(ApiError) as refused:
                quotas.admit(key, 15, 0.0)
        assert refused.value.status == 429 and "3 requests per minute" in refused.value.message

    async def test_a_refusal_holds_no_place_in_the_window_after_a_restart(
        self, store: Store, tmp_path: Path
    ) -> None:
        _, key = await create_key(store, "k")
        await set_limits(store, Scope("key", key.id), rpm=1, tpm=None)
        async with open_journal(tmp_path / "j", store, 1.0) as (journal, _):
            recorder = UsageRecorder(journal=journal)
            recorder.record(key.id, 1, "m", 429, 0, 0, 0.0, 0.0, admitted=False)
        async with open_journal(tmp_path / "j", store, 1.0) as (journal, recent):
            quotas = Quotas(UsageRecorder(journal=journal))
            await quotas.refresh(store)
            quotas.restore(recent)
            quotas.admit(key, 1, 0.0)


class TestAWriteThatFails:
    """A store that fails a write may have committed it or not; the usage is written once either way."""

    async def test_a_batch_that_committed_before_the_store_failed_is_not_added_again(
        self, store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        real = usage_module.add_usage

        async def commits_then_fails(*args: Any, **kwargs: Any) -> None:
            await real(*args, **kwargs)
            raise StoreError("the PostgreSQL store at postgresql://x@db:5432/x cannot be reached")

        async with open_journal(tmp_path / "j", store, 1.0) as (journal, _):
            recorder = UsageRecorder(journal=journal)
            _record(recorder, 3)
            monkeypatch.setattr(usage_module, "add_usage", commits_then_fails)
            with pytest.raises(StoreError):
                await recorder.flush(store)
            monkeypatch.setattr(usage_module, "add_usage", real)
            _record(recorder, 2)
            await recorder.flush(store)
        assert await _totals(store) == (5, 50, 25, pytest.approx(1.25))

    async def test_a_batch_the_store_never_took_is_written_by_the_next_flush(
        self, store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        real = usage_module.add_usage

        async def fails(*args: Any, **kwargs: Any) -> None:
            raise StoreError("the PostgreSQL store at postgresql://x@db:5432/x cannot be reached")

        async with open_journal(tmp_path / "j", store, 1.0) as (journal, _):
            recorder = UsageRecorder(journal=journal)
            _record(recorder, 3)
            monkeypatch.setattr(usage_module, "add_usage", fails)
            with pytest.raises(StoreError):
                await recorder.flush(store)
            _record(recorder, 1)
            with pytest.raises(StoreError):
                await recorder.flush(store)
            # While the store is away, budgets still count what waits for it.
            assert sum(t.requests for _, t in recorder.pending()) == 4
            monkeypatch.setattr(usage_module, "add_usage", real)
            await recorder.flush(store)
        assert await _totals(store) == (4, 40, 20, pytest.approx(1.0))
        # Nothing of it is replayed again at the next start.
        async with open_journal(tmp_path / "j", store, 1.0):
            pass
        assert await _totals(store) == (4, 40, 20, pytest.approx(1.0))


class TestSeveralServersOnOneStore:
    """Each server's journal counts its own records: no server's progress stands for another's."""

    async def test_a_killed_servers_records_are_replayed_though_another_server_wrote_higher_numbers(
        self, store: Store, tmp_path: Path
    ) -> None:
        async with open_journal(tmp_path / "a", store, 1.0) as (killed, _):
            _record(UsageRecorder(journal=killed), 3)
            _die(killed)
        async with open_journal(tmp_path / "b", store, 1.0) as (other, _):
            recorder = UsageRecorder(journal=other)
            _record(recorder, 10)
            await recorder.flush(store)
        async with open_journal(tmp_path / "a", store, 1.0):
            pass
        assert (await _totals(store))[0] == 13

    async def test_a_failed_batch_is_written_though_another_server_wrote_higher_numbers_meanwhile(
        self, store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        real = usage_module.add_usage

        async def fails_at_commit(*args: Any, **kwargs: Any) -> None:
            raise StoreError("the PostgreSQL store at postgresql://x@db:5432/x cannot be reached")

        async with (
            open_journal(tmp_path / "a", store, 1.0) as (first, _),
            open_journal(tmp_path / "b", store, 1.0) as (second, _),
        ):
            one, two = UsageRecorder(journal=first), UsageRecorder(journal=second)
            _record(one, 3)
            monkeypatch.setattr(usage_module, "add_usage", fails_at_commit)
            with pytest.raises(StoreError):
                await one.flush(store)
            monkeypatch.setattr(usage_module, "add_usage", real)
            _record(two, 10)
            await two.flush(store)
            assert await one.flush(store) == 3
        assert (await _totals(store))[0] == 13

    async def test_a_write_that_failed_before_its_commit_goes_straight_back_without_asking_the_store(
        self, store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        real = usage_module.add_usage

        async def refused(*args: Any, **kwargs: Any) -> None:
            raise NotCommitted("the PostgreSQL store at postgresql://x@db:5432/x cannot be reached")

        async def never(self: Journal, store: Store) -> int:
            raise AssertionError("a write that certainly did not commit was taken for a possible commit")

        async with open_journal(tmp_path / "j", store, 1.0) as (journal, _):
            recorder = UsageRecorder(journal=journal)
            _record(recorder, 3)
            monkeypatch.setattr(usage_module, "add_usage", refused)
            with pytest.raises(NotCommitted):
                await recorder.flush(store)
            assert sum(t.requests for _, t in recorder.pending()) == 3
            monkeypatch.setattr(usage_module, "add_usage", real)
            monkeypatch.setattr(Journal, "stored", never)
            assert await recorder.flush(store) == 3
        assert (await _totals(store))[0] == 3

    async def test_a_journal_keeps_its_id_across_restarts_and_another_has_its_own(
        self, store: Store, tmp_path: Path
    ) -> None:
        async with open_journal(tmp_path / "a", store, 1.0) as (first, _):
            pass
        async with open_journal(tmp_path / "a", store, 1.0) as (again, _):
            pass
        async with open_journal(tmp_path / "b", store, 1.0) as (other, _):
            pass
        assert first.journal_id == again.journal_id != other.journal_id


class TestWhatIsSaid:
    async def test_a_start_says_how_many_records_it_replayed(self, store: Store, tmp_path: Path) -> None:
        async with open_journal(tmp_path / "j", store, 1.0) as (journal, _):
            _record(UsageRecorder(journal=journal), 4)
            _die(journal)
        with capture_logs() as logs:
            async with open_journal(tmp_path / "j", store, 1.0):
                pass
            async with open_journal(tmp_path / "j", store, 1.0):
                pass
        assert [e["replayed_records"] for e in logs if "replayed_records" in e] == [4, 0]

    async def test_damaged_records_are_counted_in_a_log_line(self, store: Store, tmp_path: Path) -> None:
        async with open_journal(tmp_path / "j", store, 1.0) as (journal, _):
            _record(UsageRecorder(journal=journal), 3)
            _die(journal)
        (segment,) = sorted((tmp_path / "j").iterdir())[-1:]
        data = bytearray(segment.read_bytes())
        data[40] ^= 0x10
        segment.write_bytes(bytes(data))
        with capture_logs() as logs:
            async with open_journal(tmp_path / "j", store, 1.0):
                pass
        assert [e["damaged_records"] for e in logs if "damaged_records" in e] == [1]

    async def test_a_batch_found_in_the_store_after_a_failed_commit_is_said_with_its_count(
        self, store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        real = usage_module.add_usage

        async def commits_then_fails(*args: Any, **kwargs: Any) -> None:
            await real(*args, **kwargs)
            raise StoreError("the PostgreSQL store at postgresql://x@db:5432/x cannot be reached")

        async with open_journal(tmp_path / "j", store, 1.0) as (journal, _):
            recorder = UsageRecorder(journal=journal)
            _record(recorder, 3)
            monkeypatch.setattr(usage_module, "add_usage", commits_then_fails)
            with pytest.raises(StoreError):
                await recorder.flush(store)
            monkeypatch.setattr(usage_module, "add_usage", real)
            with capture_logs() as logs:
                assert await recorder.flush(store) == 0
        assert [e["requests"] for e in logs if "in the store after all" in e["event"]] == [3]


@pytest.fixture(params=["sqlite", "postgresql"])
def database(request: pytest.FixtureRequest, tmp_path: Path) -> Path | str:
    if request.param == "sqlite":
        return tmp_path / "llmgw.db"
    url: str = request.getfixturevalue("postgres_url")
    return url


async def _previous_release(database: Path | str, directory: Path, written: int, journaled: int) -> None:
    """What a release before migration 9 leaves: a store at migration 8 whose shared mark says written, the
    first written records in its usage, and a journal of journaled records with no id."""
    now = time.time()
    entries = [
        Entry(seq, now, "2026-01-01", 1, 1, "m", 200, 10, 5, 0.25, 3.0, True)
        for seq in range(1, journaled + 1)
    ]
    async with open_store(database, MIGRATIONS[:8]) as old:
        async with old.transaction() as db:
            await db.execute("UPDATE usage_journal SET applied_seq = ? WHERE id = 1", (written,))
        await add_usage(
            old,
            [
                (
                    UsageKey("2026-01-01", 1, 1, "m", 200),
                    UsageTotals(written, 10 * written, 5 * written, 0.25 * written, 3.0 * written),
                )
            ],
        )
    data = b"".join(e.encode() for e in entries) + bytes(4096)
    await asyncio.to_thread(directory.mkdir)
    await asyncio.to_thread((directory / "usage-00000000000000000001.journal").write_bytes, data)


class TestAnUpgradeFromTheSharedMark:
    """A journal written before migration 9 replays exactly what the store lacks, once."""

    async def test_the_records_above_the_shared_mark_are_replayed_and_none_below_it(
        self, database: Path | str, tmp_path: Path
    ) -> None:
        await _previous_release(database, tmp_path / "j", written=5, journaled=8)
        async with open_store(database) as store:
            async with open_journal(tmp_path / "j", store, 1.0) as (journal, _):
                assert journal.next_seq == 9
            assert await _totals(store) == (8, 80, 40, pytest.approx(2.0))
            async with open_journal(tmp_path / "j", store, 1.0):
                pass
            assert (await _totals(store))[0] == 8

    async def test_a_start_that_died_after_giving_the_journal_its_id_starts_from_the_same_mark(
        self, database: Path | str, tmp_path: Path
    ) -> None:
        await _previous_release(database, tmp_path / "j", written=5, journaled=8)
        # The id on disk, and no row in the store yet: what a start killed between the two leaves.
        (tmp_path / "j" / ID_FILE).write_text(json.dumps({"id": "0123456789abcdef", "base": 5}))
        async with open_store(database) as store:
            async with open_journal(tmp_path / "j", store, 1.0) as (journal, _):
                assert journal.journal_id == "0123456789abcdef"
            assert (await _totals(store))[0] == 8
