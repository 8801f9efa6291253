"""Unpacking a release archive without letting it write anywhere else.

A release archive is somebody else's file, unpacked by an agent that usually
runs as root: an entry named "../../etc/cron.d/x", or a symlink to "/" followed
by a file written through it, would otherwise land on the machine itself. So
every entry is placed only after its real destination is seen to be inside
the directory, symlinks only when they resolve inside it, and devices, FIFOs
and hard links, which no engine build needs, are skipped.

Blocking file work: the installer calls `unpack` through asyncio.to_thread.
"""

from __future__ import annotations

import os
import shutil
import stat
import tarfile
import zipfile
from pathlib import Path
from typing import IO

from llmgw.errors import LlmgwError


class UnsafeArchiveError(LlmgwError):
    """An archive entry that would land, or point, outside its directory."""


class ArchiveFormatError(LlmgwError):
    """A file that is not an archive this installer reads."""


def unpack(archive: Path, dest: Path) -> None:
    """Unpack a .tar.gz, .tgz, .tar or .zip into dest, which must exist."""
    name = archive.name
    if name.endswith((".tar.gz", ".tgz", ".tar")):
        _untar(archive, dest)
    elif name.endswith(".zip"):
        _unzip(archive, dest)
    else:
        raise ArchiveFormatError(f"{name} is not a .tar.gz or .zip archive")
    _check_links(dest)


class _Placer:
    """Writes entries under one root, refusing any that would leave it."""

    def __init__(self, dest: Path) -> None:
        self.root = os.path.realpath(dest)

    def _inside(self, path: str) -> bool:
        return os.path.commonpath([self.root, path]) == self.root

    def target(self, entry: str) -> str:
        """The path an entry is written to, once its real parent is known to be inside."""
        if os.path.isabs(entry):
            raise UnsafeArchiveError(f"{entry} is an absolute path, outside the install directory")
        lexical = os.path.normpath(os.path.join(self.root, entry))
        if lexical == self.root:
            return lexical
        if not self._inside(lexical):
            raise UnsafeArchiveError(f"{entry} would unpack outside the install directory")
        # Resolved through whatever symlinks earlier entries made, so a link to
        # somewhere harmless-looking cannot carry a later file out.
        parent = os.path.realpath(os.path.dirname(lexical))
        if not self._inside(parent):
            raise UnsafeArchiveError(f"{entry} would unpack outside the install directory")
        return os.path.join(parent, os.path.basename(lexical))

    def _leaf(self, entry: str) -> str:
        path = self.target(entry)
        if path == self.root:
            raise UnsafeArchiveError(f"{entry} would replace the install directory itself")
        return path

    def directory(self, entry: str) -> None:
        path = self.target(entry)
        if path == self.root:
            return
        if os.path.islink(path):
            raise UnsafeArchiveError(f"{entry} is a directory over a symlink")
        os.makedirs(path, exist_ok=True)

    def file(self, entry: str, body: IO[bytes], mode: int) -> None:
        path = self._leaf(entry)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        if os.path.lexists(path):
            os.remove(path)
        # Executable bits are kept, set-id and sticky bits and write for others are not.
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, (mode & 0o755) | 0o600)
        with os.fdopen(fd, "wb") as out:
            shutil.copyfileobj(body, out, 1 << 20)

    def symlink(self, entry: str, link: str) -> None:
        # Libraries are versioned through relative symlinks
        # (libllama.so -> libllama.so.0); one pointing anywhere else is refused.
        if os.path.isabs(link):
            raise UnsafeArchiveError(f"{entry} links outside the archive (to {link})")
        path = self._leaf(entry)
        resolved = os.path.realpath(os.path.join(os.path.dirname(path), link))
        if not self._inside(resolved):
            raise UnsafeArchiveError(f"{entry} links outside the archive (to {link})")
        os.makedirs(os.path.dirname(path), exist_ok=True)
        if os.path.lexists(path):
            os.remove(path)
        os.symlink(link, path)


def _untar(archive: Path, dest: Path) -> None:
    placer = _Placer(dest)
    try:
        with tarfile.open(archive, "r:*") as tar:
            for member in tar:
                if member.isdir():
                    placer.directory(member.name)
                elif member.isreg():
                    body = tar.extractfile(member)
                    if body is not None:
                        with body:
                            placer.file(member.name, body, member.mode)
                elif member.issym():
                    placer.symlink(member.name, member.linkname)
                # Devices, FIFOs and hard links have no business in a release.
    except tarfile.TarError as exc:
        raise ArchiveFormatError(f"{archive.name} is not a readable archive: {exc}") from None


def _unzip(archive: Path, dest: Path) -> None:
    placer = _Placer(dest)
    try:
        with zipfile.ZipFile(archive) as zf:
            for info in zf.infolist():
                mode = info.external_attr >> 16
                if info.is_dir():
                    placer.directory(info.filename)
                elif stat.S_ISLNK(mode):
                    placer.symlink(info.filename, zf.read(info).decode("utf-8", errors="replace"))
                elif mode == 0 or stat.S_ISREG(mode):
                    with zf.open(info) as body:
                        placer.file(info.filename, body, mode or 0o644)
    except zipfile.BadZipFile as exc:
        raise ArchiveFormatError(f"{archive.name} is not a readable archive: {exc}") from None


def _check_links(dest: Path) -> None:
    """Refuse a tree whose symlinks, taken together, reach outside it.

    Each link was checked when it was made, but a later link can change what an
    earlier one resolves to ("x -> y/.." means something else once "y -> ." exists).
    """
    root = os.path.realpath(dest)
    for dirpath, dirnames, filenames in os.walk(root):
        for name in (*dirnames, *filenames):
            path = os.path.join(dirpath, name)
            if os.path.islink(path):
                resolved = os.path.realpath(path)
                if os.path.commonpath([root, resolved]) != root:
                    rel = os.path.relpath(path, root)
                    raise UnsafeArchiveError(f"{rel} links outside the archive (to {os.readlink(path)})")
