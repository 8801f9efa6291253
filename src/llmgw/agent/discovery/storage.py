"""The filesystems weights are kept on, with their free space, so placement can tell a full disk.

One entry per filesystem, not per directory: the weights cache and a model
directory on the same disk share the same free bytes, and counting them twice
would make a full disk look half empty.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Sequence
from pathlib import Path

from llmgw.proto.llmgw import v1 as pb

# os.statvfs, or a stand-in that makes a disk fill up without writing gigabytes (tests).
Statvfs = Callable[[Path], os.statvfs_result]


def read_storage(dirs: Sequence[Path], statvfs: Statvfs = os.statvfs) -> list[pb.Storage]:
    """Blocking (statvfs): call through `discover_storage`."""
    seen: set[int] = set()
    out: list[pb.Storage] = []
    for directory in dirs:
        # The weights cache may not exist yet; the filesystem it will be made on is what counts.
        existing = _nearest_existing(directory)
        if existing is None:
            continue
        try:
            device = existing.stat().st_dev
            fs = statvfs(existing)
        except OSError:
            continue
        if device in seen:
            continue
        seen.add(device)
        out.append(
            pb.Storage(
                path=str(directory),
                total_bytes=fs.f_blocks * fs.f_frsize,
                # f_bavail, not f_bfree: the blocks reserved for root are not ours to fill.
                free_bytes=fs.f_bavail * fs.f_frsize,
            )
        )
    return out


async def discover_storage(dirs: Sequence[Path], statvfs: Statvfs = os.statvfs) -> list[pb.Storage]:
    return await asyncio.to_thread(read_storage, list(dirs), statvfs)


def _nearest_existing(path: Path) -> Path | None:
    for candidate in (path, *path.parents):
        if candidate.exists():
            return candidate
    return None
