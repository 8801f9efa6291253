"""A copy of the store taken while the server runs, for restoring after the file is damaged or lost.

Copying llmgw.db with cp while the server writes it can catch a transaction
half-written, and misses what is still in llmgw.db-wal. SQLite's
`VACUUM INTO` writes one consistent, self-contained file from a read
transaction, which the server's writes neither wait for nor disturb.
"""

from __future__ import annotations

import contextlib
import sqlite3
from pathlib import Path

from llmgw import durable
from llmgw.errors import StoreError
from llmgw.store.db import unusable


def backup_store(source: Path, out: Path) -> int:
    """Write a consistent copy of the store at source to out, which must not exist; its size in bytes.

    Blocking: call it from a command, or in a thread.
    """
    if not source.is_file():
        raise StoreError(f"there is no store at {source}; check `database` and `state_dir` in server.yaml")
    if out.exists():
        raise StoreError(f"{out} already exists; a backup never overwrites a file, so name a new one")
    # Written under another name and renamed when whole, so that OUT is never half a backup.
    partial = out.with_name(f".{out.name}.partial")
    with contextlib.suppress(FileNotFoundError):
        partial.unlink()
    try:
        db = sqlite3.connect(source)
        try:
            # Waits for a writer's moment rather than failing while the server commits.
            db.execute("PRAGMA busy_timeout = 5000")
            db.execute("VACUUM INTO ?", (str(partial),))
        finally:
            db.close()
        _check(partial, out)
    except sqlite3.Error as exc:
        with contextlib.suppress(FileNotFoundError):
            partial.unlink()
        if "unable to open database" in str(exc) and not out.parent.is_dir():
            raise StoreError(f"cannot write {out}: there is no directory {out.parent}") from None
        raise unusable(source, exc) from None
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            partial.unlink()
        raise
    durable.move_into_place(partial, out)
    return out.stat().st_size


def _check(copy: Path, out: Path) -> None:
    db = sqlite3.connect(copy)
    try:
        (result,) = db.execute("PRAGMA integrity_check(1)").fetchone()
    finally:
        db.close()
    if result != "ok":
        raise StoreError(f"the copy for {out} does not read back whole ({result}); nothing was written")
