"""A bundle's manifest: every file it carries, with its size, its sha256 and what it is.

The manifest is the one file whose digest a person carries apart from the
bundle (printed by `llmgw bundle create`, typed into `llmgw bundle import
--sha256`): every other file is checked against the manifest, so a bundle
changed in transit, truncated or put together from two is refused.

Paths inside a bundle mirror where their files go:

  wheels/NAME.whl                                   llmgw's wheel and its dependencies
  engines/REPO/releases/download/TAG/ASSET          a llama.cpp release archive
  engines/wheels/ENGINE/VERSION-VARIANT/NAME.whl    a wheel of vLLM's lock (a node's wheelhouse)
  models/REPO/COMMIT/PATH                           a model's file (and its .llmgw-model.json pins)
"""

from __future__ import annotations

import hashlib
import json
from pathlib import PurePosixPath
from typing import Literal

import attrs
import cattrs

from llmgw import strictjson
from llmgw.errors import LlmgwError

MANIFEST = "manifest.json"
SIGNATURE = "manifest.json.sig"
FORMAT = 1
WHEELS = "wheels"
ENGINES = "engines"
MODELS = "models"
# Under ENGINES, so the import places them beside the archives and the mirror serves them the same way.
ENGINE_WHEELS = f"{ENGINES}/wheels"

Kind = Literal["wheel", "engine", "model"]
_converter = cattrs.Converter(forbid_extra_keys=True)


class BundleError(LlmgwError):
    """A bundle that cannot be made or is refused; the message names the file and why."""


@attrs.frozen
class BundleFile:
    path: str
    size: int
    sha256: str
    kind: Kind
    # For a person reading the manifest: "llama.cpp b11434 for arm64", "org/model@0123456789ab".
    what: str = ""


@attrs.frozen
class BundleEngine:
    """One engine release the bundle carries: its archives per architecture with the publisher's digests."""

    engine: str
    repo: str
    version: str
    arch: tuple[str, ...]
    # Asset name -> sha256, as the publisher's release API gave it (and each archive was checked against).
    digests: dict[str, str]


@attrs.frozen
class BundleWheelhouse:
    """One lock of an engine installed with pip, every wheel of it carried: a node's `wheelhouse`."""

    engine: str
    version: str
    # "cpu", "cuda": which lock of the version (engines/locks/ENGINE-VERSION-VARIANT.txt).
    variant: str
    # "amd64", as the lock's header says; empty when it says none.
    machine: str
    # The directory of the bundle holding the wheels, and of the mirror's root once imported.
    path: str

    @property
    def label(self) -> str:
        """As a node's status names it: "vllm 0.32.0 (cpu)"."""
        return f"{self.engine} {self.version} ({self.variant})"


def wheelhouse_path(engine: str, version: str, variant: str) -> str:
    return f"{ENGINE_WHEELS}/{engine}/{version}-{variant}"


@attrs.frozen
class BundleModel:
    repo: str
    revision: str
    commit: str


@attrs.frozen
class Manifest:
    format: int
    llmgw_version: str
    created: str
    files: tuple[BundleFile, ...]
    engines: tuple[BundleEngine, ...] = ()
    models: tuple[BundleModel, ...] = ()
    wheelhouses: tuple[BundleWheelhouse, ...] = ()

    def to_bytes(self) -> bytes:
        return (strictjson.dumps(_converter.unstructure(self), indent=1) + "\n").encode()

    @property
    def size(self) -> int:
        return sum(f.size for f in self.files)


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def parse(data: bytes, source: str) -> Manifest:
    """The manifest in data; BundleError saying what is wrong with it."""
    try:
        manifest = _converter.structure(json.loads(data), Manifest)
    except (ValueError, cattrs.BaseValidationError) as exc:
        detail = (
            "; ".join(cattrs.transform_error(exc)) if isinstance(exc, cattrs.BaseValidationError) else exc
        )
        raise BundleError(f"{source}: {MANIFEST} is not a bundle manifest: {detail}") from None
    if manifest.format != FORMAT:
        raise BundleError(
            f"{source}: {MANIFEST} is of format {manifest.format}, and this llmgw reads format {FORMAT}; "
            "import it with the llmgw version that made it"
        )
    seen: set[str] = set()
    for f in manifest.files:
        why = unsafe_path(f.path)
        if why is not None:
            raise BundleError(f"{source}: {MANIFEST} lists {f.path!r}, {why}")
        if f.path in seen:
            raise BundleError(f"{source}: {MANIFEST} lists {f.path!r} twice")
        seen.add(f.path)
        top = PurePosixPath(f.path).parts[0]
        if (f.kind, top) not in (("wheel", WHEELS), ("engine", ENGINES), ("model", MODELS)):
            raise BundleError(f"{source}: {MANIFEST} lists {f.path!r} as a {f.kind}, which belongs elsewhere")
        if len(f.sha256) != 64 or any(c not in "0123456789abcdef" for c in f.sha256) or f.size < 0:
            raise BundleError(f"{source}: {MANIFEST} gives {f.path!r} no valid sha256 and size")
    for w in manifest.wheelhouses:
        # Its path becomes the URL a node is told to install from.
        if w.path != wheelhouse_path(w.engine, w.version, w.variant) or unsafe_path(w.path) is not None:
            raise BundleError(
                f"{source}: {MANIFEST} names the wheels of {w.label} at {w.path!r}, not where they go"
            )
    return manifest


def unsafe_path(path: str) -> str | None:
    """Why path may not be a file of a bundle (it would land outside it); None when it may."""
    parts = PurePosixPath(path).parts
    if not parts or path.startswith("/") or "\\" in path or "\0" in path:
        return "which is not a relative path"
    if any(p in ("..", ".") for p in parts) or path != PurePosixPath(*parts).as_posix():
        return "which is not a plain path inside the bundle (no '..', no '.', no '//')"
    return None
