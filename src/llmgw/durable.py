"""Files replaced whole and on disk: after a power loss, the old file or the new one, never an empty one.

A rename is atomic for a process that dies, not for the machine: ext4 and XFS may commit the new
name before the new file's blocks, and a power loss then leaves a file of length 0 where the
agent's engine secrets, the upgrade marker or server.yaml were. So the new file is synced before
the rename, and its directory after it, before the caller goes on (and, say, tells the control
plane the upgrade is committed). Every replace of a file llmgw keeps goes through here
(tests/test_durable.py holds src/ to it). Blocking: callers on the event loop use a thread.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Callable
from pathlib import Path


def write_atomically(
    path: Path, data: bytes | str, mode: int = 0o644, *, prepare: Callable[[Path], object] | None = None
) -> None:
    """Replace path with data, whole, with mode, and on disk before this returns.

    The new file is written beside path (the same file system, or the rename would be a copy) under a
    name of its own, created with mode so a secret is never readable by others, not even for a moment.
    prepare, when given, is run on it before it takes path's name (to give it an owner or a group).
    """
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.new")
    payload = data.encode() if isinstance(data, str) else data
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    try:
        try:
            # The umask narrows os.open's mode; what was asked for is what the file gets.
            os.fchmod(fd, mode)
            view = memoryview(payload)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        if prepare is not None:
            prepare(tmp)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    sync_directory(path.parent)


def move_into_place(source: Path, target: Path) -> None:
    """Rename source (a file, a directory or a symlink written whole) over target, on disk before this
    returns: source's contents first (a directory's whole tree), then the directories that hold the
    names."""
    _sync_tree(source)
    os.replace(source, target)
    sync_directory(target.parent)
    if source.parent != target.parent:
        sync_directory(source.parent)


def sync_directory(directory: Path) -> None:
    """Make the names in directory durable: a file created or renamed there is not until this."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _sync_tree(path: Path) -> None:
    """Sync path's bytes, or for a directory every file and directory under it, deepest first.

    A symlink has nothing of its own to sync: its target is written with its name, which the
    directory's sync makes durable.
    """
    if path.is_symlink():
        return
    if path.is_dir():
        for root, dirs, files in os.walk(path, topdown=False):
            for name in files:
                entry = Path(root, name)
                if not entry.is_symlink():
                    _sync_file(entry)
            for name in dirs:
                entry = Path(root, name)
                if not entry.is_symlink():
                    sync_directory(entry)
        sync_directory(path)
        return
    _sync_file(path)


def _sync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
