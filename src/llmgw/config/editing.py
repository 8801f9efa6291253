"""Changing a configuration file a person owns: one section's keys set, every other key and comment kept.

`llmgw bundle import` points server.yaml's engine_mirror at the mirror and
`server init --bundle` adds its `mirror:` section; both rewrite a file that
is the operator's, so both go through here: the text is read as it was
written, only the named keys change, and the result is checked as the server
will read it before it replaces the file whole.
"""

from __future__ import annotations

import contextlib
import io
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar

from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap

from llmgw import durable
from llmgw.config.loading import parse
from llmgw.config.yamltext import read_yaml

T = TypeVar("T")


def with_section(cls: type[T], text: str, source: str, section: str, values: Mapping[str, Any]) -> str:
    """text with `section`'s keys set to values (the section made when absent); ConfigError when the
    result would not load as cls."""
    data: Any = read_yaml(text, source)
    if data is None:
        data = CommentedMap()
    held = data.get(section)
    if not isinstance(held, CommentedMap):
        held = CommentedMap()
        data[section] = held
    for key, value in values.items():
        held[key] = CommentedMap(value) if isinstance(value, Mapping) else value
    out = io.StringIO()
    yaml = YAML(typ="rt")
    # A line per value, never folded: a person greps server.yaml for an asset's name.
    yaml.width = 4096
    yaml.dump(data, out)
    new_text = out.getvalue()
    parse(cls, new_text, source)
    return new_text


def replace_text(path: Path, text: str) -> None:
    """path replaced whole, keeping its mode and owner: never a half-written file a server reads."""
    st = path.stat()

    def owned(tmp: Path) -> None:
        # Not root: the file stays ours, which is who wrote the original.
        with contextlib.suppress(PermissionError):
            os.chown(tmp, st.st_uid, st.st_gid)

    durable.write_atomically(path, text, st.st_mode & 0o7777, prepare=owned)
