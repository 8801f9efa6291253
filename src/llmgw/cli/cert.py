"""`llmgw cert`: the deployment's certificate authority and the certificates it signs."""

from __future__ import annotations

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
def issue_server(name: str, hosts: tuple[str, ...], ca_dir: Path, out: Path | None) -> None:
    """Issue the agent service's certificate NAME, valid for every --host."""
    try:
        cert_path, key_path = pki.issue_server(ca_dir, name, hosts, out or ca_dir)
    except CertificateError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(f"wrote {cert_path} and {key_path} for {', '.join(hosts)}")


@cert.command("issue-agent")
@click.argument("node")
@_dir_option
@_out_option
def issue_agent(node: str, ca_dir: Path, out: Path | None) -> None:
    """Issue node NODE's client certificate; its common name is the node id."""
    try:
        cert_path, key_path = pki.issue_agent(ca_dir, node, out or ca_dir)
    except CertificateError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(f"wrote {cert_path} and {key_path} for node {node}")
