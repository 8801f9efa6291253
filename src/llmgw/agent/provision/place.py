"""Where an installed build lives, and the marker that says it is whole.

One directory per build, `<root>/<engine>/<version>-<variant>`. A build is
made in `<dir>.partial` and renamed into place with its marker only at the
end, so an install that is interrupted leaves nothing that looks installed.
Blocking, all of it: the installers call these in a thread.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from llmgw import durable, strictjson

MARKER = ".llmgw-installed"


def read_marker(directory: Path, engine: str, version: str, variant: str) -> dict[str, Any] | None:
    """The marker of directory when it records this engine, version and variant; else None."""
    try:
        data = json.loads((directory / MARKER).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict):
        return None
    same = (data.get("engine"), data.get("version"), data.get("variant")) == (engine, version, variant)
    return data if same else None


def fresh_dirs(*dirs: Path) -> None:
    for d in dirs:
        shutil.rmtree(d, ignore_errors=True)
        d.mkdir(parents=True)


def remove_dirs(*dirs: Path) -> None:
    for d in dirs:
        shutil.rmtree(d, ignore_errors=True)


def put_in_place(partial: Path, directory: Path, marker: dict[str, Any]) -> None:
    # The marker goes in last, inside the scratch directory, and the rename
    # makes it all appear at once.
    (partial / MARKER).write_text(strictjson.dumps(marker, indent=2) + "\n", encoding="utf-8")
    shutil.rmtree(directory, ignore_errors=True)
    durable.move_into_place(partial, directory)
