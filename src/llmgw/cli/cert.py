"""`llmgw cert`: the deployment's certificate authority and the certificates it signs."""

from __future__ import annotations

import grp
import os
from pathlib import Path

import click

from llmgw import pki
from llmgw.errors import CertificateError

_dir_option = click.option(
    "--dir",
    "ca_dir",
    required=True,
    type=click.Path(file_okay=False, path_type=Path),
    help="Directory of the certificate authority (ca.pem, ca-key.pem).",
)
_out_option = click.option(
    "--out",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Directory to write NAME.pem and NAME-key.pem into; defaults to --dir.",
)
_group_option = click.option(
    "--group",
    default=None,
    help="Make the key readable by this group (root:GROUP, mode 0640), e.g. llmgw, the service's user; "
    "by default only its owner may read it.",
)


def _group_id(group: str | None) -> int | None:
    """--group's id, checked before anything is written: refused after, it left a certificate and a
    key behind that nobody could use as asked."""
    if group is None:
        return None
    try:
        gid = grp.getgrnam(group).gr_gid
    except KeyError:
        raise click.ClickException(
            f"there is no group {group!r} on this machine; nothing was written"
        ) from None
    # chown(2): only root, or a member of the group, may give a file to it.
    if os.geteuid() != 0 and gid != os.getegid() and gid not in os.getgroups():
        raise click.ClickException(
            f"only root or a member of group {group!r} may give it a key: run this as root; "
            "nothing was written"
        )
    return gid


def _share_key(key_path: Path, group: str | None, gid: int | None) -> None:
    """Let group read key_path: a service running as the llmgw user cannot read a root-only key."""
    if gid is None:
        return
    try:
        os.chown(key_path, -1, gid)
        os.chmod(key_path, 0o640)
    except PermissionError:
        raise click.ClickException(
            f"wrote {key_path} but could not give group {group!r} read access: "
            "run this as root, or as a member of that group"
        ) from None


@click.group()
def cert() -> None:
    """Create the certificate authority and issue server and agent certificates."""


@cert.command("init-ca")
@_dir_option
def init_ca(ca_dir: Path) -> None:
    """Create a new certificate authority in --dir."""
    try:
        pki.init_ca(ca_dir)
    except CertificateError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(f"wrote {ca_dir / pki.CA_CERT} and {ca_dir / pki.CA_KEY} (keep the key private)")


@cert.command("issue-server")
@click.argument("name")
@click.option(
    "--host",
    "hosts",
    multiple=True,
    required=True,
    help="A name or IP address agents dial; repeat for each.",
)
@_dir_option
@_out_option
@_group_option
def issue_server(
    name: str, hosts: tuple[str, ...], ca_dir: Path, out: Path | None, group: str | None
) -> None:
    """Issue the agent service's certificate NAME, valid for every --host."""
    gid = _group_id(group)
    try:
        cert_path, key_path = pki.issue_server(ca_dir, name, hosts, out or ca_dir)
    except CertificateError as exc:
        raise click.ClickException(str(exc)) from None
    _share_key(key_path, group, gid)
    click.echo(f"wrote {cert_path} and {key_path} for {', '.join(hosts)}")


@cert.command("issue-agent")
@click.argument("node")
@_dir_option
@_out_option
@_group_option
def issue_agent(node: str, ca_dir: Path, out: Path | None, group: str | None) -> None:
    """Issue node NODE's client certificate; its common name is the node id."""
    gid = _group_id(group)
    try:
        cert_path, key_path = pki.issue_agent(ca_dir, node, out or ca_dir)
    except CertificateError as exc:
        raise click.ClickException(str(exc)) from None
    _share_key(key_path, group, gid)
    click.echo(f"wrote {cert_path} and {key_path} for node {node}")


@cert.command("kubernetes-secrets")
@click.option(
    "--node",
    "nodes",
    multiple=True,
    required=True,
    help="A GPU node's Kubernetes name (its agent's node id); repeat for each node the agent runs on.",
)
@click.option("--namespace", default="llmgw", show_default=True, help="The namespace llmgw runs in.")
@click.option(
    "--host",
    "hosts",
    multiple=True,
    help="Another name or address of the agent service, for nodes outside the cluster; repeat for each.",
)
@click.option(
    "--admin-token",
    is_flag=True,
    help="Also write the Secret llmgw-admin-token: an admin token (kept in --dir as kubernetes-admin-token, "
    "the same on every run) for the chart's adminToken.secretName.",
)
@_dir_option
@click.option(
    "--out",
    "out_file",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="File to write the manifests to; defaults to standard output.",
)
def kubernetes_secrets(
    nodes: tuple[str, ...],
    namespace: str,
    hosts: tuple[str, ...],
    admin_token: bool,
    ca_dir: Path,
    out_file: Path | None,
) -> None:
    """Write the Secrets the Helm chart (deploy/helm/llmgw) mounts: the server's certificate and every node's.

    Issues what --dir lacks (the server's certificate for the agent service's names, each
    --node's), keeps what it has, and never puts the authority's key in a Secret. With
    --admin-token, an admin token's Secret too.
    """
    from llmgw.kube_secrets import SecretsRequest, secret_manifests

    request = SecretsRequest(
        ca_dir=ca_dir, namespace=namespace, nodes=nodes, server_hosts=hosts, admin_token=admin_token
    )
    try:
        manifests = secret_manifests(request)
    except FileNotFoundError:
        raise click.ClickException(
            f"there is no certificate authority in {ca_dir}: "
            f"create it with `llmgw cert init-ca --dir {ca_dir}`"
        ) from None
    except CertificateError as exc:
        raise click.ClickException(str(exc)) from None
    if out_file is None:
        click.echo(manifests, nl=False)
        return
    # The keys are in it: readable by its owner alone, as NAME-key.pem is.
    out_file.touch(mode=0o600)
    out_file.chmod(0o600)
    out_file.write_text(manifests)
    click.echo(f"wrote the Secrets for the server and {len(nodes)} node(s) to {out_file}", err=True)
