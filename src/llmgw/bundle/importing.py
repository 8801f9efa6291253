"""`llmgw bundle import`: a bundle checked whole, then placed in the mirror and named in server.yaml.

Everything is checked before anything is placed: the manifest against the
sha256 carried apart, its signature against the keys trusted here, then
every file's size and sha256, each copied (or unpacked from the tar) into a
staging directory under the mirror's root as it is hashed, so that what is
placed is byte for byte what was checked. A tar member that is a link, a
device, or a path leading out of the bundle is refused, as is a tar that
ends early. Any refusal removes the staging directory and leaves the mirror
and server.yaml as they were.

Then the models go to ROOT/REPO/COMMIT/ (their pins last, as a fetch places
them), the engines' archives to ROOT/engines/REPO/releases/download/TAG/,
and server.yaml's `engine_mirror` is set to the mirror's URL for them and
their digests, written last and whole. vLLM's wheels go to
ROOT/engines/wheels/ENGINE/VERSION-VARIANT/, a directory the mirror serves as
a page of links for pip; each node is told of it in its own agent.yaml
(`engines.vllm.wheelhouse`), which the import names and does not write.

Blocking throughout (hashing gigabytes): call it in a thread from a loop.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import tarfile
import tempfile
import zlib
from collections.abc import Callable
from pathlib import Path, PurePosixPath
from typing import IO

import attrs
import cattrs

from llmgw import config, durable
from llmgw.agent.discovery.host import Host
from llmgw.agent.provision.recipes import RECIPES
from llmgw.bundle import signing
from llmgw.bundle.manifest import (
    ENGINES,
    MANIFEST,
    MODELS,
    SIGNATURE,
    BundleError,
    BundleWheelhouse,
    Manifest,
    digest,
    parse,
    unsafe_path,
)
from llmgw.bundle.wheelhouse import HOST_ARCH
from llmgw.config import ServerConfig
from llmgw.config.editing import replace_text, with_section
from llmgw.engines.base import Recipe, UnsupportedError
from llmgw.errors import ConfigError
from llmgw.mirror.fetch import INCOMING, FetchedModel, model_dir, place_model, read_model
from llmgw.mirror.fetch import MANIFEST as PINS

_READ = 8 << 20
# A manifest of a hundred thousand files is a few tens of megabytes.
_MAX_MANIFEST = 64 << 20
_converter = cattrs.Converter()
Report = Callable[[str], None]


@attrs.frozen
class ImportOptions:
    bundle: Path
    # The manifest's sha256, as `llmgw bundle create` printed it.
    sha256: str
    # The mirror's root, where models and engine archives go.
    root: Path
    # server.yaml, whose engine_mirror is set; None leaves it alone (refused when the bundle has engines).
    server_config: Path | None
    # Where nodes reach the mirror's files (http://models.internal:8081); else server.yaml's mirror.url.
    mirror_url: str = ""
    trust_dir: Path = signing.DEFAULT_TRUST_DIR
    allow_unsigned: bool = False


@attrs.frozen
class Imported:
    manifest: Manifest
    # The trusted key that signed it; None for an unsigned bundle.
    signer: str | None
    # engine_mirror.base_url as set in server.yaml; empty when the bundle has no engine.
    engine_base_url: str
    # Where nodes find the mirror (--mirror-url, else server.yaml's mirror.url); empty when neither says.
    mirror_url: str = ""

    def wheelhouse_urls(self) -> list[tuple[BundleWheelhouse, str]]:
        """Each wheelhouse placed, with the URL agent.yaml names it by (`engines.ENGINE.wheelhouse`)."""
        base = self.mirror_url or "http://MIRROR:8081"
        return [(w, f"{base}/files/{w.path}/") for w in self.manifest.wheelhouses]


# The packaging families, as a node's operator knows them.
_FAMILIES = {"deb": "Debian, Ubuntu", "rpm": "RHEL, Rocky, Fedora"}


def node_packages(manifest: Manifest) -> list[str]:
    """The OS packages each carried engine's builds need, by family: "libgomp1 (Debian, Ubuntu)".

    A node installs them with its own apt-get or dnf when they are missing, which an offline node
    cannot do unless its package sources are a mirror on the site: a bundle carries no OS packages.
    """
    by_family: dict[str, set[str]] = {}
    for carried in manifest.engines:
        recipe = RECIPES.get(carried.engine)
        if not isinstance(recipe, Recipe):
            continue
        for arch in carried.arch:
            for driver in ("", "any"):
                try:
                    build = recipe.choose(carried.version, Host(arch=HOST_ARCH[arch], nvidia_driver=driver))
                except (UnsupportedError, KeyError):
                    continue
                for family, names in build.packages.items():
                    by_family.setdefault(family, set()).update(names)
    return [
        f"{' '.join(sorted(names))} ({_FAMILIES.get(family, family)})"
        for family, names in sorted(by_family.items())
    ]


def import_bundle(opts: ImportOptions, report: Report) -> Imported:
    """Check opts.bundle whole, then place it; BundleError (or ConfigError) naming the file when refused."""
    expected = opts.sha256.strip().lower()
    if len(expected) != 64 or any(c not in "0123456789abcdef" for c in expected):
        raise BundleError(
            f"--sha256 {opts.sha256!r} is not a sha256 "
            "(64 hexadecimal digits, as `llmgw bundle create` printed)"
        )
    if not opts.bundle.exists():
        raise BundleError(f"{opts.bundle} does not exist")
    trusted = signing.trusted_keys(opts.trust_dir)
    created_root = not opts.root.exists()
    incoming = opts.root / INCOMING
    try:
        incoming.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix="bundle-", dir=incoming))
    except OSError as exc:
        raise BundleError(
            f"cannot stage the bundle in the mirror's root: {exc.filename or incoming}: {exc.strerror}; "
            "nothing was imported"
        ) from None
    placing = False
    try:
        if opts.bundle.is_dir():
            manifest, signer = _stage_directory(
                opts.bundle, staging, expected, trusted, opts.allow_unsigned, report
            )
        else:
            manifest, signer = _stage_tar(
                opts.bundle, staging, expected, trusted, opts.allow_unsigned, report
            )
        models = _check_pins(opts.bundle, staging, manifest)
        server_text, base_url = _engine_mirror(opts, manifest)
        report(f"checked {len(manifest.files)} files ({manifest.size:,} bytes); placing them in {opts.root}")
        placing = True
        _place(opts.root, staging, manifest, models)
        if server_text is not None and opts.server_config is not None:
            replace_text(opts.server_config, server_text)
            report(f"set engine_mirror in {opts.server_config}: {base_url}")
    except OSError as exc:
        _abandon(staging, incoming, opts.root if created_root and not placing else None)
        # A full disk or a directory that cannot be written, said in words; while staging, nothing
        # was placed, and while placing, what was placed is whole (a model's pins come last).
        where = exc.filename or opts.root
        said = "the import stopped partway; run it again" if placing else "nothing was imported"
        raise BundleError(f"cannot write {where}: {exc.strerror or exc}; {said}") from None
    except BaseException:
        _abandon(staging, incoming, opts.root if created_root else None)
        raise
    _abandon(staging, incoming, None)
    return Imported(manifest=manifest, signer=signer, engine_base_url=base_url, mirror_url=_mirror_url(opts))


def _abandon(staging: Path, incoming: Path, root: Path | None) -> None:
    """Remove the staging, and the directories made for it (the root too, when the import made it)."""
    shutil.rmtree(staging, ignore_errors=True)
    _remove_if_empty(incoming)
    if root is not None:
        _remove_if_empty(root)


def _checked_manifest(
    source: Path,
    data: bytes,
    signature: bytes | None,
    expected: str,
    trusted: list[signing.TrustedKey],
    allow_unsigned: bool,
) -> tuple[Manifest, str | None]:
    manifest = _digest_checked(source, data, expected)
    return manifest, _signed_by(source, data, signature, trusted, allow_unsigned)


def _digest_checked(source: Path, data: bytes, expected: str) -> Manifest:
    got = digest(data)
    if got != expected:
        raise BundleError(
            f"{source}: {MANIFEST} has sha256 {got}, not the {expected} given with --sha256: this is not the "
            "bundle that was handed over, or it was changed on the way"
        )
    return parse(data, str(source))


def _signed_by(
    source: Path,
    data: bytes,
    signature: bytes | None,
    trusted: list[signing.TrustedKey],
    allow_unsigned: bool,
) -> str | None:
    try:
        return signing.check(data, signature, trusted, allow_unsigned)
    except BundleError as exc:
        raise BundleError(f"{source}: {exc}") from None


def _stage_directory(
    bundle: Path,
    staging: Path,
    expected: str,
    trusted: list[signing.TrustedKey],
    allow_unsigned: bool,
    report: Report,
) -> tuple[Manifest, str | None]:
    try:
        data = (bundle / MANIFEST).read_bytes()
    except FileNotFoundError:
        raise BundleError(
            f"{bundle} has no {MANIFEST}: it is not a bundle, or not all of one was copied"
        ) from None
    signature_path = bundle / SIGNATURE
    signature = signature_path.read_bytes() if signature_path.is_file() else None
    manifest, signer = _checked_manifest(bundle, data, signature, expected, trusted, allow_unsigned)
    for number, f in enumerate(manifest.files, 1):
        report(f"checking {f.path} ({number} of {len(manifest.files)})")
        source = bundle / f.path
        if not source.is_file() or source.is_symlink():
            raise BundleError(f"{bundle}: {f.path} is missing; nothing was imported")
        target = staging / f.path
        target.parent.mkdir(parents=True, exist_ok=True)
        with source.open("rb") as src:
            sha, size = _copy_hashing(src, target)
        _compare(bundle, f.path, f.size, f.sha256, size, sha)
    return manifest, signer


def _stage_tar(
    bundle: Path,
    staging: Path,
    expected: str,
    trusted: list[signing.TrustedKey],
    allow_unsigned: bool,
    report: Report,
) -> tuple[Manifest, str | None]:
    """Unpack the tar member by member into staging, refusing a member that is not a plain file inside it.

    The manifest comes first and is checked against --sha256 before anything else is
    unpacked, and each member after it must be a file it lists, of the size it says:
    a tar that is not the bundle fills no disk before it is refused.
    """
    held: dict[str, tuple[str, int]] = {}
    manifest: Manifest | None = None
    data = b""
    signature: bytes | None = None
    member_name = ""
    try:
        with tarfile.open(bundle, "r:*") as tar:
            for member in tar:
                member_name = member.name
                why = unsafe_path(member.name)
                if why is not None:
                    raise BundleError(f"{bundle}: the tar holds {member.name!r}, {why}; nothing was imported")
                if member.isdir():
                    continue
                if not member.isfile():
                    raise BundleError(
                        f"{bundle}: the tar member {member.name} is a link or a device, which a bundle never "
                        "holds; nothing was imported"
                    )
                if member.name in held or (member.name == SIGNATURE and signature is not None):
                    raise BundleError(f"{bundle}: the tar holds {member.name} twice; nothing was imported")
                if manifest is None:
                    if member.name != MANIFEST:
                        raise BundleError(
                            f"{bundle}: the tar begins with {member.name}, not {MANIFEST}: it was not made "
                            "by `llmgw bundle create --tar`; nothing was imported"
                        )
                    data = _small(tar, member, bundle)
                    manifest = _digest_checked(bundle, data, expected)
                    listed = {f.path: f for f in manifest.files}
                    continue
                if member.name == SIGNATURE:
                    signature = _small(tar, member, bundle)
                    continue
                entry = listed.get(member.name)
                if entry is None:
                    raise BundleError(
                        f"{bundle}: the tar holds {member.name}, which {MANIFEST} does not list; "
                        "nothing was imported"
                    )
                if member.size != entry.size:
                    raise BundleError(
                        f"{bundle}: {member.name} is {member.size:,} bytes where the manifest says "
                        f"{entry.size:,}; nothing was imported"
                    )
                report(f"unpacking {member.name}")
                fh = tar.extractfile(member)
                assert fh is not None  # a regular file always has its data
                target = staging / member.name
                target.parent.mkdir(parents=True, exist_ok=True)
                held[member.name] = _copy_hashing(fh, target)
                if held[member.name][1] != member.size:
                    raise _truncated(bundle, member.name)
    except (tarfile.ReadError, EOFError, zlib.error) as exc:
        if member_name and "end of data" not in str(exc) and not isinstance(exc, EOFError):
            raise BundleError(
                f"{bundle}: the tar is damaged at {member_name}: {exc}; nothing was imported"
            ) from None
        if not member_name:
            raise BundleError(f"{bundle} is not a bundle: neither a directory nor a tar ({exc})") from None
        raise _truncated(bundle, member_name) from None
    if manifest is None:
        raise BundleError(f"{bundle} has no {MANIFEST}: it is not a bundle, or not all of one was copied")
    signer = _signed_by(bundle, data, signature, trusted, allow_unsigned)
    for f in manifest.files:
        if f.path not in held:
            raise BundleError(f"{bundle}: {f.path} is missing; nothing was imported")
        sha, size = held[f.path]
        _compare(bundle, f.path, f.size, f.sha256, size, sha)
    return manifest, signer


def _small(tar: tarfile.TarFile, member: tarfile.TarInfo, bundle: Path) -> bytes:
    """A manifest or a signature, read whole: refused past a size no real one comes near."""
    if member.size > _MAX_MANIFEST:
        raise BundleError(
            f"{bundle}: {member.name} is {member.size:,} bytes, more than any bundle's; nothing was imported"
        )
    fh = tar.extractfile(member)
    assert fh is not None
    data = fh.read()
    if len(data) != member.size:
        raise _truncated(bundle, member.name)
    return data


def _truncated(bundle: Path, member: str) -> BundleError:
    return BundleError(
        f"{bundle}: the tar is truncated: it ends inside {member}; copy the whole file again; "
        "nothing was imported"
    )


def _copy_hashing(src: IO[bytes], target: Path) -> tuple[str, int]:
    hasher = hashlib.sha256()
    size = 0
    with target.open("wb") as out:
        while chunk := src.read(_READ):
            hasher.update(chunk)
            out.write(chunk)
            size += len(chunk)
    return hasher.hexdigest(), size


def _compare(bundle: Path, path: str, size: int, sha256: str, got_size: int, got_sha: str) -> None:
    if got_size != size:
        raise BundleError(
            f"{bundle}: {path} is {got_size:,} bytes where the manifest says {size:,}; nothing was imported"
        )
    if got_sha != sha256:
        raise BundleError(
            f"{bundle}: {path} does not match the manifest (sha256 {got_sha}, expected {sha256}); "
            "nothing was imported"
        )


def _check_pins(bundle: Path, staging: Path, manifest: Manifest) -> list[FetchedModel]:
    """Each model's pins, checked against the manifest: a node checks its copy against them."""
    listed = {f.path: f for f in manifest.files}
    models = []
    for m in manifest.models:
        base = f"{MODELS}/{m.repo}/{m.commit}"
        pins = f"{base}/{PINS}"
        if pins not in listed:
            raise BundleError(f"{bundle}: {pins} is missing from the manifest; nothing was imported")
        model = read_model(staging / base)
        if model is None or (model.repo, model.commit) != (m.repo, m.commit):
            raise BundleError(
                f"{bundle}: {pins} does not hold the pins of {m.repo}@{m.commit}; nothing was imported"
            )
        for f in model.files:
            entry = listed.get(f"{base}/{f.path}")
            if entry is None or unsafe_path(f.path) is not None:
                raise BundleError(f"{bundle}: {base}/{f.path} is pinned but missing; nothing was imported")
            if (entry.sha256, entry.size) != (f.sha256, f.size):
                raise BundleError(
                    f"{bundle}: {base}/{f.path} does not match its pin in {PINS}; nothing was imported"
                )
        models.append(model)
    return models


def _engine_mirror(opts: ImportOptions, manifest: Manifest) -> tuple[str | None, str]:
    """server.yaml's new text with engine_mirror set, checked as the server will read it; (None, "") when
    the bundle has no engine."""
    if not manifest.engines:
        return None, ""
    if opts.server_config is None:
        raise BundleError("the bundle holds engines, and no server.yaml was given to point nodes at them")
    path = opts.server_config
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise BundleError(
            f"cannot set engine_mirror in {path}: {exc.strerror} (--server-config names the control "
            "plane's server.yaml); nothing was imported"
        ) from None
    current = config.parse(ServerConfig, text, str(path))
    url = (opts.mirror_url or current.mirror.url).rstrip("/")
    if not url:
        raise BundleError(
            f"where do nodes reach the mirror? {path} sets no mirror.url; give it with --mirror-url "
            "(http://models.internal:8081); nothing was imported"
        )
    if not os.access(path.parent, os.W_OK) or not os.access(path, os.W_OK):
        # Found now rather than after the mirror was filled, with server.yaml still pointing elsewhere.
        raise BundleError(f"cannot write {path}, so engine_mirror cannot be set; nothing was imported")
    base_url = f"{url}/files/{ENGINES}"
    checksums = dict(current.engine_mirror.checksums)
    for engine in manifest.engines:
        checksums.update({asset: f"sha256:{sha}" for asset, sha in engine.digests.items()})
    sections = {"base_url": base_url, "checksums": dict(sorted(checksums.items()))}
    try:
        new_text = with_section(ServerConfig, text, str(path), "engine_mirror", sections)
    except ConfigError as exc:
        raise BundleError(f"engine_mirror could not be set: {exc}; nothing was imported") from None
    return new_text, base_url


def _mirror_url(opts: ImportOptions) -> str:
    """The mirror's URL as a node reaches it; empty when neither --mirror-url nor server.yaml says."""
    if opts.mirror_url or opts.server_config is None or not opts.server_config.is_file():
        return opts.mirror_url.rstrip("/")
    try:
        return config.load(ServerConfig, opts.server_config).mirror.url.rstrip("/")
    except (ConfigError, OSError):
        # Only to name a URL in a sentence: a server.yaml that cannot be read is no reason to refuse.
        return ""


def _place(root: Path, staging: Path, manifest: Manifest, models: list[FetchedModel]) -> None:
    for f in manifest.files:
        if f.kind != "engine":
            continue
        target = root / PurePosixPath(f.path)
        target.parent.mkdir(parents=True, exist_ok=True)
        durable.move_into_place(staging / f.path, target)
    for model in models:
        final = model_dir(root, model.repo, model.commit)
        held = read_model(final)
        kept = {f.path: f for f in held.files} if held is not None else {}
        files = sorted({**kept, **{f.path: f for f in model.files}}.values(), key=lambda f: f.path)
        whole = attrs.evolve(model, files=files)
        place_model(
            root, staging / MODELS / model.repo / model.commit, final, whole, [f.path for f in model.files]
        )


def _remove_if_empty(path: Path) -> None:
    with contextlib.suppress(OSError):
        path.rmdir()
