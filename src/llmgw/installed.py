"""Where the running llmgw was installed from: a release on the package index, a wheel file, a checkout.

What another machine needs to install the same llmgw depends on it: a
release is `llmgw==VERSION` from the index, but a version built from a
checkout (docs/install.md's step 1) is on no index, and a pip told to fetch
it fails with "No matching distribution found for llmgw==0.1.0". pip records
a local origin in the installed distribution's direct_url.json (PEP 610): the
checkout's directory (editable or not) or the wheel's file; an install from
an index records none.
"""

from __future__ import annotations

import importlib.metadata
import json
import urllib.parse
import urllib.request
from pathlib import Path

import attrs

# The checkout this module lies in, when it is run from one without being installed (PYTHONPATH=src).
_SOURCE_TREE = Path(__file__).resolve().parents[2]


@attrs.frozen
class Origin:
    """Where llmgw came from: a local directory or wheel file, or neither (an index)."""

    # A source tree holding pyproject.toml: a checkout, installed from it or run from it.
    checkout: Path | None = None
    # The wheel file pip installed it from (which may since have been deleted).
    wheel: Path | None = None

    @property
    def from_index(self) -> bool:
        """Whether another machine's pip can get this llmgw by its version from a package index."""
        return self.checkout is None and self.wheel is None


def origin() -> Origin:
    """Where the running llmgw was installed from, as pip recorded it."""
    try:
        recorded = importlib.metadata.distribution("llmgw").read_text("direct_url.json")
    except importlib.metadata.PackageNotFoundError:
        recorded = None
        if (_SOURCE_TREE / "pyproject.toml").is_file():
            return Origin(checkout=_SOURCE_TREE)
    if not recorded:
        return Origin()
    return parse_direct_url(recorded)


def parse_direct_url(text: str) -> Origin:
    """An Origin from a direct_url.json's text; an index's (none) for a URL that is no local file."""
    try:
        said = json.loads(text)
        url = urllib.parse.urlsplit(said["url"])
    except (ValueError, KeyError, TypeError):
        return Origin()
    if url.scheme != "file":
        return Origin()
    path = Path(urllib.request.url2pathname(url.path))
    if "dir_info" in said:
        return Origin(checkout=path)
    if path.name.endswith(".whl"):
        return Origin(wheel=path)
    return Origin()
