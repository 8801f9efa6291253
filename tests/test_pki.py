"""The deployment's certificate authority, its certificates, and `llmgw cert`."""

from __future__ import annotations

import ipaddress
import os
import re
import ssl
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from click.testing import CliRunner
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from llmgw import pki
from llmgw.cli.cert import cert
from llmgw.config import TLSConfig
from llmgw.errors import CertificateError

from . import needs


def load(path: Path) -> x509.Certificate:
    return x509.load_pem_x509_certificate(path.read_bytes())


def cn(certificate: x509.Certificate) -> str:
    return str(certificate.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value)


@pytest.fixture
def ca(tmp_path: Path) -> Path:
    pki.init_ca(tmp_path / "ca")
    return tmp_path / "ca"


class TestAuthority:
    def test_a_new_authority_keeps_its_key_readable_by_its_owner_only(self, ca: Path):
        assert stat.S_IMODE((ca / "ca-key.pem").stat().st_mode) == 0o600
        constraints = load(ca / "ca.pem").extensions.get_extension_for_class(x509.BasicConstraints)
        assert constraints.value.ca

    def test_an_existing_authority_is_never_replaced(self, ca: Path):
        before = (ca / "ca.pem").read_bytes()
        with pytest.raises(CertificateError, match="refusing to replace the certificate authority"):
            pki.init_ca(ca)
        assert (ca / "ca.pem").read_bytes() == before

    def test_issuing_without_an_authority_says_how_to_create_one(self, tmp_path: Path):
        with pytest.raises(CertificateError, match="llmgw cert init-ca --dir"):
            pki.issue_agent(tmp_path / "nowhere", "n1", tmp_path)


class TestCertificates:
    def test_a_server_certificate_names_every_host_with_addresses_as_ip_entries(
        self, ca: Path, tmp_path: Path
    ):
        cert_path, key_path = pki.issue_server(ca, "control", ["127.0.0.1", "localhost", "::1"], tmp_path)
        assert (cert_path.name, key_path.name) == ("control.pem", "control-key.pem")
        certificate = load(cert_path)
        san = certificate.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        assert san.get_values_for_type(x509.IPAddress) == [
            ipaddress.ip_address("127.0.0.1"),
            ipaddress.ip_address("::1"),
        ]
        assert san.get_values_for_type(x509.DNSName) == ["localhost"]
        assert cn(certificate) == "control"
        usage = certificate.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
        assert list(usage) == [ExtendedKeyUsageOID.SERVER_AUTH]
        assert stat.S_IMODE(key_path.stat().st_mode) == 0o600

    def test_an_agent_certificate_is_named_by_its_node_id_and_is_for_clients(self, ca: Path, tmp_path: Path):
        cert_path, _ = pki.issue_agent(ca, "gpu-07", tmp_path)
        certificate = load(cert_path)
        assert cn(certificate) == "gpu-07"
        usage = certificate.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
        assert list(usage) == [ExtendedKeyUsageOID.CLIENT_AUTH]
        san = certificate.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        assert san.get_values_for_type(x509.DNSName) == ["gpu-07"]
        certificate.verify_directly_issued_by(load(ca / "ca.pem"))

    @pytest.mark.parametrize("node", ["n1/../../etc", "../n1", "n1\n", "-n1", "n" * 64, ""])
    def test_a_node_id_that_cannot_be_a_file_name_is_refused_and_nothing_is_written(
        self, ca: Path, tmp_path: Path, node: str
    ):
        out = tmp_path / "out" / "deep"
        with pytest.raises(CertificateError, match="is not allowed; a node id is letters, digits and"):
            pki.issue_agent(ca, node, out)
        assert not (tmp_path / "out").exists() and not list(tmp_path.glob("*.pem"))

    def test_a_server_certificate_name_that_would_leave_the_out_directory_is_refused(
        self, ca: Path, tmp_path: Path
    ):
        out = tmp_path / "out" / "deep"
        refusal = re.escape("the certificate name '../../x' is not allowed")
        with pytest.raises(CertificateError, match=refusal):
            pki.issue_server(ca, "../../x", ["127.0.0.1"], out)
        assert not list(tmp_path.glob("x*.pem"))

    def test_a_certificate_from_another_authority_is_explained(self, ca: Path, tmp_path: Path):
        pki.init_ca(tmp_path / "other")
        cert_path, _ = pki.issue_agent(tmp_path / "other", "n1", tmp_path)
        assert pki.certificate_problem(cert_path, ca / "ca.pem") == (
            f"{cert_path} is not signed by the certificate authority {ca / 'ca.pem'}"
        )
        own, _ = pki.issue_agent(ca, "n2", tmp_path)
        assert pki.certificate_problem(own, ca / "ca.pem") is None


class TestContexts:
    def test_the_agent_service_requires_a_client_certificate(self, ca: Path, tmp_path: Path):
        cert_path, key_path = pki.issue_server(ca, "control", ["127.0.0.1"], tmp_path)
        ctx = pki.server_ssl_context(TLSConfig(ca=str(ca / "ca.pem"), cert=str(cert_path), key=str(key_path)))
        assert ctx.verify_mode == ssl.CERT_REQUIRED

    def test_every_context_trusts_the_clusters_authority_and_no_public_one(self, ca: Path, tmp_path: Path):
        """A certificate a public authority signed for a node's name must not pass as that node."""
        cert_path, key_path = pki.issue_server(ca, "control", ["127.0.0.1"], tmp_path)
        tls = TLSConfig(ca=str(ca / "ca.pem"), cert=str(cert_path), key=str(key_path))
        ours = load(ca / "ca.pem")
        for ctx in (
            pki.server_ssl_context(tls),
            pki.client_ssl_context(tls),
            pki.https_server_ssl_context(tls, "the mirror"),
            pki.https_client_ssl_context(tls, "the control plane"),
        ):
            trusted = ctx.get_ca_certs(binary_form=True)
            assert [x509.load_der_x509_certificate(der) for der in trusted] == [ours]
            assert ctx.verify_mode == ssl.CERT_REQUIRED

    def test_a_missing_certificate_file_is_named(self, ca: Path, tmp_path: Path):
        tls = TLSConfig(
            ca=str(ca / "ca.pem"), cert=str(tmp_path / "n1.pem"), key=str(tmp_path / "n1-key.pem")
        )
        with pytest.raises(CertificateError, match=r"tls.cert names .*n1.pem, which does not exist"):
            pki.client_ssl_context(tls)

    def test_an_unset_certificate_is_named(self):
        with pytest.raises(CertificateError, match=r"tls\.ca is not set"):
            pki.client_ssl_context(TLSConfig())


def test_the_cert_commands_write_an_authority_and_its_certificates(tmp_path: Path):
    runner = CliRunner()
    ca, out = tmp_path / "ca", tmp_path / "out"
    assert runner.invoke(cert, ["init-ca", "--dir", str(ca)]).exit_code == 0
    result = runner.invoke(
        cert,
        [
            "issue-server",
            "control",
            "--host",
            "127.0.0.1",
            "--host",
            "cp.lan",
            "--dir",
            str(ca),
            "--out",
            str(out),
        ],
    )
    assert result.exit_code == 0, result.output
    assert "127.0.0.1, cp.lan" in result.output
    result = runner.invoke(cert, ["issue-agent", "n1", "--dir", str(ca), "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert cn(load(out / "n1.pem")) == "n1"
    again = runner.invoke(cert, ["init-ca", "--dir", str(ca)])
    assert again.exit_code != 0
    assert "refusing to replace the certificate authority" in again.output


class TestAKeyTheServiceCannotRead:
    def test_a_root_only_key_is_named_with_what_to_do_not_a_bare_permission_error(self) -> None:
        """The server or mirror, as the llmgw user, ended in `PermissionError: [Errno 13]`, naming no file."""
        needs.root("reading a key as another user")
        setpriv = needs.program("setpriv", "util-linux")
        with tempfile.TemporaryDirectory() as directory:
            base = Path(directory)
            base.chmod(0o755)
            pki.init_ca(base / "ca")
            (base / "ca").chmod(0o755)
            (base / "ca" / "ca.pem").chmod(0o644)
            cert_path, key_path = pki.issue_server(base / "ca", "server", ["127.0.0.1"], base / "ca")
            cert_path.chmod(0o644)
            assert stat.S_IMODE(key_path.stat().st_mode) == 0o600
            program = (
                "import sys; from llmgw import pki; from llmgw.config import TLSConfig\n"
                "from llmgw.errors import ConfigError\n"
                f"tls = TLSConfig(ca={str(base / 'ca' / 'ca.pem')!r}, cert={str(cert_path)!r},"
                f" key={str(key_path)!r})\n"
                "try:\n    pki.server_ssl_context(tls)\nexcept ConfigError as exc:\n    sys.exit(str(exc))\n"
            )
            done = subprocess.run(
                [
                    setpriv,
                    "--reuid=nobody",
                    "--regid=nogroup",
                    "--clear-groups",
                    sys.executable,
                    "-c",
                    program,
                ],
                capture_output=True,
                text=True,
                env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
                check=False,
                timeout=60,
            )
        assert done.returncode == 1, done.stderr
        assert f"tls.key names {key_path}, which this process" in done.stderr
        assert "--group llmgw" in done.stderr and "Traceback" not in done.stderr

    def test_issue_with_group_makes_the_key_readable_by_that_group(self, ca: Path, tmp_path: Path) -> None:
        needs.root("giving a key to a group")
        result = CliRunner().invoke(
            cert, ["issue-agent", "gpu-01", "--dir", str(ca), "--out", str(tmp_path), "--group", "nogroup"]
        )
        assert result.exit_code == 0, result.output
        key = (tmp_path / "gpu-01-key.pem").stat()
        assert stat.S_IMODE(key.st_mode) == 0o640 and key.st_gid == 65534

    @pytest.mark.parametrize(
        "command", [["issue-agent", "gpu-01"], ["issue-server", "gpu-01", "--host", "127.0.0.1"]]
    )
    def test_issue_with_a_group_that_does_not_exist_says_so_and_writes_nothing(
        self, ca: Path, tmp_path: Path, command: list[str]
    ) -> None:
        """The refusal came after the certificate and its key were written, left there for nobody."""
        out = tmp_path / "out"
        result = CliRunner().invoke(
            cert, [*command, "--dir", str(ca), "--out", str(out), "--group", "no-such-group"]
        )
        assert result.exit_code == 1
        assert "there is no group 'no-such-group' on this machine; nothing was written" in result.output
        assert not out.exists()

    def test_issue_with_a_group_this_user_may_not_give_a_file_to_writes_nothing(self) -> None:
        needs.root("issuing as a user of no group")
        setpriv = needs.program("setpriv", "util-linux")
        with tempfile.TemporaryDirectory() as directory:
            base = Path(directory)
            base.chmod(0o777)
            # An authority this user may sign with, so that only the group stands in its way.
            pki.init_ca(base / "ca")
            (base / "ca").chmod(0o755)
            for name in (pki.CA_CERT, pki.CA_KEY):
                (base / "ca" / name).chmod(0o644)
            args = ["issue-agent", "gpu-01", "--dir", str(base / "ca"), "--out", str(base / "out")]
            program = f"from llmgw.cli.cert import cert\ncert({[*args, '--group', 'root']!r})\n"
            nobody = [setpriv, "--reuid=nobody", "--regid=nogroup", "--clear-groups"]
            done = subprocess.run(
                [*nobody, sys.executable, "-c", program],
                capture_output=True,
                text=True,
                env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
                check=False,
                timeout=60,
            )
            written = (base / "out").exists()
        assert done.returncode == 1, done.stderr
        assert "only root or a member of group 'root' may give it a key" in done.stderr
        assert not written
