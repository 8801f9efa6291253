"""Who made a bundle: an ed25519 signature over its manifest, checked against the keys trusted here.

The manifest's sha256, carried apart, says the bundle is the one somebody
handed over; a signature says who made it, so a site that trusts its release
team's key refuses a bundle anyone else put together, even with its digest.

The signature is `manifest.json.sig` beside the manifest: the signer's raw
public key and the signature, each in base64. Trusted keys are PEM public
keys, one file per key (NAME.pem), in the trust directory.

Blocking throughout (small files): call it in a thread from a loop.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import os
import re
import tarfile
from pathlib import Path

import attrs
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from llmgw import durable, strictjson
from llmgw.bundle.manifest import MANIFEST, SIGNATURE, BundleError

DEFAULT_TRUST_DIR = Path("/etc/llmgw/bundle-keys")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


@attrs.frozen
class TrustedKey:
    name: str
    fingerprint: str
    key: Ed25519PublicKey = attrs.field(eq=False)


def fingerprint(key: Ed25519PublicKey) -> str:
    """ "SHA256:…", as ssh-keygen -l shows a key: what a person compares over the phone."""
    raw = key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return "SHA256:" + base64.b64encode(hashlib.sha256(raw).digest()).decode().rstrip("=")


def generate(path: Path) -> Path:
    """A new private key at path (0600) and its public key at path.pub; the public key's path."""
    public_path = path.with_name(path.name + ".pub")
    for p in (path, public_path):
        if p.exists():
            raise BundleError(
                f"{p} exists; a key is never overwritten (a lost signing key cannot be had back)"
            )
    key = Ed25519PrivateKey.generate()
    pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(pem)
    public_path.write_bytes(
        key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    return public_path


def load_private(path: Path) -> Ed25519PrivateKey:
    try:
        key = serialization.load_pem_private_key(path.read_bytes(), password=None)
    except OSError as exc:
        raise BundleError(f"cannot read the signing key {path}: {exc.strerror}") from None
    except (ValueError, TypeError):
        raise BundleError(
            f"{path} is not an unencrypted PEM private key (`llmgw bundle keygen` makes one)"
        ) from None
    if not isinstance(key, Ed25519PrivateKey):
        raise BundleError(
            f"{path} is not an ed25519 key; bundles are signed with ed25519 (`llmgw bundle keygen`)"
        )
    return key


def load_public(path: Path) -> Ed25519PublicKey:
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise BundleError(f"cannot read the key {path}: {exc.strerror}") from None
    try:
        key = serialization.load_pem_public_key(data)
    except ValueError:
        raise BundleError(
            f"{path} is not a PEM public key (the KEY.pub `llmgw bundle keygen` wrote)"
        ) from None
    if not isinstance(key, Ed25519PublicKey):
        raise BundleError(f"{path} is not an ed25519 public key")
    return key


def signature_for(manifest: bytes, key: Ed25519PrivateKey) -> bytes:
    """The contents of manifest.json.sig for manifest, signed with key."""
    raw = key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    body = {"key": base64.b64encode(raw).decode(), "signature": base64.b64encode(key.sign(manifest)).decode()}
    return (strictjson.dumps(body, indent=1) + "\n").encode()


def check(
    manifest: bytes, signature: bytes | None, trusted: list[TrustedKey], allow_unsigned: bool
) -> str | None:
    """The name of the trusted key that signed manifest; None for an unsigned bundle allowed in.

    BundleError for a signature that does not verify, a signer not trusted here,
    and an unsigned bundle where keys are trusted (unless allow_unsigned).
    """
    if signature is None:
        if trusted and not allow_unsigned:
            raise BundleError(
                f"the bundle is not signed, and this machine trusts only bundles signed by "
                f"{', '.join(k.name for k in trusted)}; sign it (`llmgw bundle sign`) or import it "
                "with --allow-unsigned"
            )
        return None
    try:
        body = json.loads(signature)
        raw_key = base64.b64decode(body["key"], validate=True)
        signed = base64.b64decode(body["signature"], validate=True)
        key = Ed25519PublicKey.from_public_bytes(raw_key)
    except (ValueError, KeyError, TypeError):
        raise BundleError(f"{SIGNATURE} is not a bundle signature (`llmgw bundle sign` writes one)") from None
    try:
        key.verify(signed, manifest)
    except InvalidSignature:
        raise BundleError(
            f"{SIGNATURE} does not verify against the manifest: the manifest was changed after it was signed"
        ) from None
    for candidate in trusted:
        if candidate.key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw) == raw_key:
            return candidate.name
    raise BundleError(
        f"the bundle is signed by {fingerprint(key)}, a key this machine does not trust; "
        "if it is your release team's, add its public key with `llmgw bundle trust add KEYFILE`"
    )


def trusted_keys(directory: Path) -> list[TrustedKey]:
    """The keys in the trust directory (none when it does not exist), by name."""
    if not directory.is_dir():
        return []
    keys = []
    for path in sorted(directory.glob("*.pem")):
        key = load_public(path)
        keys.append(TrustedKey(name=path.stem, fingerprint=fingerprint(key), key=key))
    return keys


def trust(directory: Path, keyfile: Path, name: str | None) -> TrustedKey:
    """Add the public key in keyfile to the trust directory as name (default: the file's name)."""
    key = load_public(keyfile)
    name = name or keyfile.name.removesuffix(".pub").removesuffix(".pem")
    if not _NAME.fullmatch(name):
        raise BundleError(
            f"{name!r} cannot name a key: letters, digits, '.', '_' and '-', up to 64 (--name NAME)"
        )
    added = TrustedKey(name=name, fingerprint=fingerprint(key), key=key)
    for held in trusted_keys(directory):
        if held.fingerprint == added.fingerprint:
            raise BundleError(f"{keyfile} is already trusted, as {held.name}")
        if held.name == name:
            raise BundleError(
                f"a key named {name} is already trusted ({held.fingerprint}); give another --name"
            )
    directory.mkdir(parents=True, exist_ok=True)
    (directory / f"{name}.pem").write_bytes(
        key.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    )
    return added


def distrust(directory: Path, name: str) -> None:
    path = directory / f"{name}.pem"
    if not _NAME.fullmatch(name) or not path.is_file():
        held = ", ".join(k.name for k in trusted_keys(directory)) or "none"
        raise BundleError(f"no trusted key is named {name!r} (trusted: {held})")
    path.unlink()


def sign_bundle(bundle: Path, key: Ed25519PrivateKey) -> None:
    """Write the signature of bundle's manifest into it: beside the manifest, or as a tar member added last.

    The manifest itself is unchanged, so the sha256 carried apart stays right.
    """
    if bundle.is_dir():
        try:
            manifest = (bundle / MANIFEST).read_bytes()
        except FileNotFoundError:
            raise BundleError(f"{bundle} has no {MANIFEST}: it is not a bundle") from None
        durable.write_atomically(bundle / SIGNATURE, signature_for(manifest, key))
        return
    try:
        with tarfile.open(bundle, "r:") as tar:
            names = tar.getnames()
            if MANIFEST not in names:
                raise BundleError(f"{bundle} has no {MANIFEST}: it is not a bundle")
            if SIGNATURE in names:
                raise BundleError(
                    f"{bundle} is already signed; sign the directory it was made from again instead"
                )
            member = tar.extractfile(MANIFEST)
            assert member is not None
            manifest = member.read()
    except tarfile.ReadError as exc:
        raise BundleError(
            f"{bundle} is not an uncompressed tar ({exc}): "
            "sign the bundle `llmgw bundle create` made, as it is"
        ) from None
    signature = signature_for(manifest, key)
    info = tarfile.TarInfo(SIGNATURE)
    info.size, info.mode = len(signature), 0o644
    with tarfile.open(bundle, "a:") as tar:
        tar.addfile(info, io.BytesIO(signature))
