"""`llmgw cert kubernetes-secrets`: the Secrets the Helm chart mounts, issued from the authority."""

from __future__ import annotations

import base64
import stat
from pathlib import Path
from typing import Any

from click.testing import CliRunner
from ruamel.yaml import YAML

from llmgw import pki
from llmgw.cli.cert import cert
from llmgw.kube_secrets import SecretsRequest, secret_manifests, service_names


def _secrets(text: str) -> dict[str, dict[str, bytes]]:
    docs: list[dict[str, Any]] = [d for d in YAML(typ="safe").load_all(text) if d]
    return {d["metadata"]["name"]: {k: base64.b64decode(v) for k, v in d["data"].items()} for d in docs}


def test_the_server_secret_holds_a_certificate_for_every_name_of_the_agent_service(tmp_path: Path) -> None:
    pki.init_ca(tmp_path)
    text = secret_manifests(SecretsRequest(tmp_path, "ml", ["gpu-01"], server_hosts=["203.0.113.10"]))
    server = _secrets(text)["llmgw-server-tls"]
    assert set(server) == {"ca.pem", "server.pem", "server-key.pem"}
    names = pki.certificate_names(tmp_path / "kubernetes-server.pem")
    assert {*service_names("ml"), "203.0.113.10"} <= set(names)
    assert "llmgw-agents.ml.svc" in names


def test_the_agent_secret_holds_each_nodes_certificate_by_its_name_and_never_the_authoritys_key(
    tmp_path: Path,
) -> None:
    pki.init_ca(tmp_path)
    text = secret_manifests(SecretsRequest(tmp_path, "llmgw", ["gpu-01", "gpu-02"]))
    agents = _secrets(text)["llmgw-agent-tls"]
    assert set(agents) == {"ca.pem", "gpu-01.pem", "gpu-01-key.pem", "gpu-02.pem", "gpu-02-key.pem"}
    assert agents["gpu-02.pem"] == (tmp_path / "gpu-02.pem").read_bytes()
    assert (tmp_path / "ca-key.pem").read_bytes() not in text.encode()


def test_a_second_run_for_a_new_node_keeps_the_certificates_already_issued(tmp_path: Path) -> None:
    pki.init_ca(tmp_path)
    first = _secrets(secret_manifests(SecretsRequest(tmp_path, "llmgw", ["gpu-01"])))
    second = _secrets(secret_manifests(SecretsRequest(tmp_path, "llmgw", ["gpu-01", "gpu-02"])))
    assert second["llmgw-server-tls"] == first["llmgw-server-tls"]
    assert second["llmgw-agent-tls"]["gpu-01.pem"] == first["llmgw-agent-tls"]["gpu-01.pem"]


def test_the_command_writes_the_file_readable_by_its_owner_only(tmp_path: Path) -> None:
    pki.init_ca(tmp_path / "pki")
    out = tmp_path / "secrets.yaml"
    done = CliRunner().invoke(
        cert, ["kubernetes-secrets", "--dir", str(tmp_path / "pki"), "--node", "gpu-01", "--out", str(out)]
    )
    assert done.exit_code == 0, done.output
    assert stat.S_IMODE(out.stat().st_mode) == 0o600
    assert set(_secrets(out.read_text())) == {"llmgw-server-tls", "llmgw-agent-tls"}


def test_without_an_authority_it_says_how_to_make_one(tmp_path: Path) -> None:
    done = CliRunner().invoke(cert, ["kubernetes-secrets", "--dir", str(tmp_path), "--node", "gpu-01"])
    assert done.exit_code == 1
    assert f"llmgw cert init-ca --dir {tmp_path}" in done.output


def test_an_admin_token_secret_is_written_when_asked_and_the_same_on_every_run(tmp_path: Path) -> None:
    """A new token on a second run (a node added) would lock out whoever uses the first."""
    pki.init_ca(tmp_path)
    assert set(_secrets(secret_manifests(SecretsRequest(tmp_path, "llmgw", ["gpu-01"])))) == {
        "llmgw-server-tls",
        "llmgw-agent-tls",
    }
    first = _secrets(secret_manifests(SecretsRequest(tmp_path, "llmgw", ["gpu-01"], admin_token=True)))
    token = first["llmgw-admin-token"]["token"]
    assert token.startswith(b"llmgw-admin-")
    assert stat.S_IMODE((tmp_path / "kubernetes-admin-token").stat().st_mode) == 0o600
    request = SecretsRequest(tmp_path, "llmgw", ["gpu-01", "gpu-02"], admin_token=True)
    assert _secrets(secret_manifests(request))["llmgw-admin-token"]["token"] == token


def test_the_command_writes_the_admin_token_secret_with_admin_token(tmp_path: Path) -> None:
    pki.init_ca(tmp_path)
    args = ["kubernetes-secrets", "--dir", str(tmp_path), "--node", "gpu-01", "--admin-token"]
    done = CliRunner().invoke(cert, args)
    assert done.exit_code == 0, done.output
    assert "llmgw-admin-token" in _secrets(done.stdout)
