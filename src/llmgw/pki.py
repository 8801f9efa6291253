"""The certificate authority of a deployment, its certificates, and the TLS contexts of the agent stream.

One CA signs two kinds of certificate: the control plane's server certificate
(every name and address agents dial, in subjectAltName) and one client
certificate per node, whose common name *is* the node id. The agent service
trusts nothing else, so a node can only ever speak as the node its
certificate names.

These functions read and write files; callers inside the event loop run them
in a thread (`asyncio.to_thread`).
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import ssl
from collections.abc import Sequence
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from llmgw import names
from llmgw.config import TLSConfig
from llmgw.errors import CertificateError, ConfigError

CA_CERT = "ca.pem"
CA_KEY = "ca-key.pem"
CA_DAYS = 3650
LEAF_DAYS = 825


def init_ca(directory: Path) -> None:
    """Create ca.pem and ca-key.pem (mode 0600) in directory; refuse to replace an existing CA."""
    cert_path, key_path = directory / CA_CERT, directory / CA_KEY
    for path in (cert_path, key_path):
        if path.exists():
            # Replacing the CA silently would orphan every node certificate it signed.
            raise CertificateError(
                f"{path} already exists: refusing to replace the certificate authority, "
                "every certificate it signed would stop being trusted"
            )
    directory.mkdir(parents=True, exist_ok=True)
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "llmgw certificate authority")])
    now = _now()
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=CA_DAYS))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    _write_key(key_path, key)
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))


def issue_server(ca_dir: Path, name: str, hosts: Sequence[str], out: Path) -> tuple[Path, Path]:
    """Write out/NAME.pem and out/NAME-key.pem: a serverAuth certificate naming every host."""
    # NAME.pem: a name such as ../x would write the certificate and its key elsewhere than --out.
    problem = names.file_stem_problem(name, "certificate name")
    if problem is not None:
        raise CertificateError(problem)
    if not hosts:
        raise CertificateError(
            f"the server certificate {name} needs at least one --host: agents check the address they dial"
        )
    sans: list[x509.GeneralName] = []
    for host in hosts:
        try:
            sans.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            sans.append(x509.DNSName(host))
    return _issue(ca_dir, name, sans, ExtendedKeyUsageOID.SERVER_AUTH, out)


def issue_agent(ca_dir: Path, node_id: str, out: Path) -> tuple[Path, Path]:
    """Write out/NODE.pem and out/NODE-key.pem: a clientAuth certificate whose common name is the node id."""
    problem = names.node_id_problem(node_id)
    if problem is not None:
        raise CertificateError(problem)
    return _issue(ca_dir, node_id, [x509.DNSName(node_id)], ExtendedKeyUsageOID.CLIENT_AUTH, out)


def _context(purpose: ssl.Purpose) -> ssl.SSLContext:
    """A context that trusts nothing yet: only tls.ca is loaded into it.

    Not ssl.create_default_context: it loads the system's public authorities too, and then a
    certificate any of them signed, for a name that equals a node id, would pass as that node.
    """
    if purpose is ssl.Purpose.CLIENT_AUTH:
        return ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    # Verifies the server's certificate and its name, as create_default_context would.
    return ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)


def server_ssl_context(tls: TLSConfig) -> ssl.SSLContext:
    """TLS for the agent service: every client must present a certificate signed by tls.ca."""
    ctx = _context(ssl.Purpose.CLIENT_AUTH)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.verify_mode = ssl.CERT_REQUIRED
    _load(ctx, tls, "the agent service")
    ctx.set_alpn_protocols(["h2"])
    return ctx


def client_ssl_context(tls: TLSConfig) -> ssl.SSLContext:
    """TLS for an agent: present this node's certificate, trust only a server signed by tls.ca."""
    ctx = _context(ssl.Purpose.SERVER_AUTH)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    _load(ctx, tls, "this agent")
    ctx.set_alpn_protocols(["h2"])
    return ctx


def https_server_ssl_context(tls: TLSConfig, who: str) -> ssl.SSLContext:
    """TLS for an HTTPS listener whose every client must present a certificate signed by tls.ca.

    Unlike the agent service's, it offers no ALPN: aiohttp speaks HTTP/1.1.
    """
    ctx = _context(ssl.Purpose.CLIENT_AUTH)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.verify_mode = ssl.CERT_REQUIRED
    _load(ctx, tls, who)
    return ctx


def https_client_ssl_context(tls: TLSConfig, who: str) -> ssl.SSLContext:
    """TLS for an HTTPS client presenting tls.cert, trusting only a server signed by tls.ca."""
    ctx = _context(ssl.Purpose.SERVER_AUTH)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    _load(ctx, tls, who)
    return ctx


def peer_common_name(peercert: object) -> str | None:
    """The common name in the subject of a certificate as ssl's getpeercert() gives it."""
    if not isinstance(peercert, dict):
        return None
    for rdn in peercert.get("subject", ()):
        for key, value in rdn:
            if key == "commonName":
                return str(value)
    return None


def certificate_problem(cert_path: Path, ca_path: Path) -> str | None:
    """Why the other side of mutual TLS would refuse cert_path, if the CA at ca_path is the one it trusts."""
    try:
        cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
        ca = x509.load_pem_x509_certificate(ca_path.read_bytes())
    except (OSError, ValueError) as exc:
        return f"the certificates cannot be read: {exc}"
    try:
        cert.verify_directly_issued_by(ca)
    except (ValueError, TypeError, InvalidSignature):
        return f"{cert_path} is not signed by the certificate authority {ca_path}"
    now = _now()
    if cert.not_valid_after_utc < now:
        return f"{cert_path} expired on {cert.not_valid_after_utc:%Y-%m-%d}"
    if cert.not_valid_before_utc > now:
        return f"{cert_path} is not valid before {cert.not_valid_before_utc:%Y-%m-%d %H:%M} UTC"
    return None


def certificate_names(cert_path: Path) -> list[str]:
    """Every DNS name and IP address cert_path's subjectAltName holds, IPs in their canonical text."""
    cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
    try:
        sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return []
    found: list[str] = [name.lower() for name in sans.get_values_for_type(x509.DNSName)]
    found.extend(str(ip) for ip in sans.get_values_for_type(x509.IPAddress))
    return found


def is_issued_by(cert_path: Path, ca_path: Path) -> bool:
    """Whether the authority whose certificate is ca_path signed cert_path (validity dates aside)."""
    cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
    ca = x509.load_pem_x509_certificate(ca_path.read_bytes())
    try:
        cert.verify_directly_issued_by(ca)
    except (ValueError, TypeError, InvalidSignature):
        return False
    return True


def _load(ctx: ssl.SSLContext, tls: TLSConfig, who: str) -> None:
    for key, value in (("tls.ca", tls.ca), ("tls.cert", tls.cert), ("tls.key", tls.key)):
        if not value:
            raise CertificateError(f"{key} is not set: {who} needs it for mutual TLS")
        _readable(key, value)
    try:
        ctx.load_verify_locations(cafile=tls.ca)
    except ssl.SSLError as exc:
        raise CertificateError(f"tls.ca {tls.ca} is not a PEM certificate: {exc.reason}") from None
    try:
        ctx.load_cert_chain(tls.cert, tls.key)
    except ssl.SSLError as exc:
        # OpenSSL gives no reason for a file that is not PEM at all: "PEM lib" is all it says.
        why = exc.reason or "one of them is not PEM, or the key is not the certificate's"
        raise CertificateError(
            f"tls.cert {tls.cert} and tls.key {tls.key} cannot be used together: {why}"
        ) from None


def _readable(key: str, path: str) -> None:
    """CertificateError when path is not a file, ConfigError naming it when this user cannot read it.

    ssl's loaders raise a bare PermissionError naming no file: a server or mirror started as the
    llmgw user on a key `llmgw cert issue-*` wrote root-only (0600) ended in a traceback.
    """
    try:
        with open(path, "rb"):
            pass
    except IsADirectoryError:
        raise CertificateError(f"{key} names {path}, which is a directory, not a file") from None
    except (FileNotFoundError, NotADirectoryError):
        raise CertificateError(f"{key} names {path}, which does not exist") from None
    except PermissionError:
        raise ConfigError(
            f"{key} names {path}, which this process (uid {os.getuid()}) may not read; "
            f"give its group read access (chgrp llmgw {path} && chmod 640 {path}), "
            "or issue it again with --group llmgw"
        ) from None


def _issue(
    ca_dir: Path,
    name: str,
    sans: list[x509.GeneralName],
    usage: x509.ObjectIdentifier,
    out: Path,
) -> tuple[Path, Path]:
    ca_cert, ca_key = _read_ca(ca_dir)
    key = ec.generate_private_key(ec.SECP256R1())
    now = _now()
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=LEAF_DAYS))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )
    out.mkdir(parents=True, exist_ok=True)
    cert_path, key_path = out / f"{name}.pem", out / f"{name}-key.pem"
    _write_key(key_path, key)
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return cert_path, key_path


def _read_ca(ca_dir: Path) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    cert_path, key_path = ca_dir / CA_CERT, ca_dir / CA_KEY
    try:
        cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
        key = serialization.load_pem_private_key(key_path.read_bytes(), password=None)
    except FileNotFoundError as exc:
        raise CertificateError(
            f"{exc.filename} does not exist: create the authority first "
            f"with `llmgw cert init-ca --dir {ca_dir}`"
        ) from None
    except ValueError as exc:
        raise CertificateError(f"the certificate authority in {ca_dir} cannot be read: {exc}") from None
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise CertificateError(f"{key_path} is not a key llmgw wrote (expected an EC P-256 key)")
    return cert, key


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey) -> None:
    data = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    # Created 0600 from the start, so the key is never readable by others, not even briefly.
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.chmod(path, 0o600)


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)
