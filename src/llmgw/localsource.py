"""A model's weights on the control plane's own disk: `source: /path/model.gguf`, `file://…`, or a directory.

A person with a GGUF file or a Hugging Face directory on the server had to set
up a mirror, or a web server, before a node could fetch it. Now the server
serves such a source itself (control/localfiles.py), as the mirror serves a
directory: a file's URL, or a directory's URL ending in "/" that answers with
its listing. Every file's sha256 is taken when the model is added (`llmgw ctl
model add`, or the server's start for server.yaml's models) and sent with it
as its pins, so a file changed on the disk afterwards is refused by the nodes,
never served as the model that was added.

Hashing reads every byte (minutes for a 40 GB file): the functions here that
touch the disk block, and their callers run them in a thread.
"""

from __future__ import annotations

import hashlib
import urllib.parse
from pathlib import Path, PurePosixPath

from llmgw import download
from llmgw.errors import ConfigError

FILE_SCHEME = "file://"


def local_path(source: str) -> Path | None:
    """The path a source names on this machine (`/abs/path` or `file:///abs/path`); None for any other."""
    if source.startswith(FILE_SCHEME):
        parsed = urllib.parse.urlsplit(source)
        if parsed.netloc not in ("", "localhost"):
            return None
        return Path(urllib.parse.unquote(parsed.path))
    if source.startswith("/"):
        return Path(source)
    return None


def is_local(source: str) -> bool:
    return local_path(source) is not None


def local_files(path: Path) -> list[tuple[str, Path]]:
    """(name relative to the source, path) of every file a source at path serves; ConfigError when none.

    A directory's regular files, every level down; names beginning with a dot (a Hugging Face
    cache's .cache/, an editor's swap file) and symbolic links are left out, as the mirror leaves
    them out. Blocking: it walks the tree.
    """
    if path.is_file():
        return [(path.name, path)]
    if not path.exists():
        raise ConfigError(
            f"{path} does not exist on the server (a local source is read on the server's disk)"
        )
    if not path.is_dir():
        raise ConfigError(f"{path} is neither a file nor a directory")
    files = []
    for found in sorted(path.rglob("*")):
        name = found.relative_to(path).as_posix()
        if any(part.startswith(".") for part in PurePosixPath(name).parts):
            continue
        if found.is_symlink() or not found.is_file():
            continue
        files.append((name, found))
    if not files:
        raise ConfigError(f"{path} holds no file to serve")
    return files


def pin(path: Path) -> dict[str, str]:
    """name -> sha256 of every file a source at path serves. Blocking: it reads every byte."""
    pins = {}
    for name, file in local_files(path):
        hasher = hashlib.sha256()
        download.hash_prefix(file, hasher)
        pins[name] = hasher.hexdigest()
    return pins


def mismatch(given: dict[str, str], pins: dict[str, str]) -> str | None:
    """What differs between the pins a definition states and the files' own; None when they agree."""
    for name, digest in given.items():
        held = pins.get(name)
        if held is None:
            return f"'sha256' pins {name}, which the source does not hold (it holds {', '.join(pins)})"
        if digest.removeprefix("sha256:").strip().lower() != held:
            return f"{name}'s sha256 is {held}, not the {digest} 'sha256' pins"
    return None
