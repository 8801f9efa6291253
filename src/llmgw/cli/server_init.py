"""`llmgw server init`: set this machine up as a control plane and start it."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import attrs
import click

from llmgw.cli.exit import EXIT_CONFIG, EXIT_ERROR
from llmgw.errors import ConfigError, LlmgwError
from llmgw.serverinit.controlplane import HEALTH_TIMEOUT_S, InitOptions, init_control_plane, next_steps
from llmgw.serverinit.system import HostSystem, InstallError, System


@click.group()
def server() -> None:
    """Set up the machine the control plane runs on."""


@server.command()
@click.option(
    "--admin",
    metavar="EMAIL",
    help="The first administrator's email; a password is generated and printed once.",
)
@click.option(
    "--host",
    "hosts",
    multiple=True,
    metavar="NAME",
    help="A name or address nodes dial that this machine cannot see of itself "
    "(a DNS alias, a NAT or floating address); repeatable.",
)
@click.option(
    "--pki",
    type=click.Path(path_type=Path, file_okay=False),
    help="The certificate authority's directory; created with the authority when empty "
    "[default: /etc/llmgw/pki].",
)
@click.pass_obj
def init(obj: object, admin: str | None, hosts: tuple[str, ...], pki: Path | None) -> None:
    """Create what a control plane needs and start it: the llmgw user and directories, a
    certificate authority, the server's certificate for every address of this machine,
    server.yaml, the store with its administrator, and the systemd unit.

    Each step is skipped when its result is already there, so init can be run again: to
    finish an install that stopped, or with another --host to add a name to the
    certificate. It never overwrites server.yaml, an authority or a password.
    """
    # Tests hand in a System that acts on a temporary root; a person gets this machine.
    seam = obj if isinstance(obj, InitSeam) else InitSeam(system=HostSystem(), root=Path("/"))
    system = seam.system
    refusal = system.refusal()
    if refusal is not None:
        click.echo(f"llmgw: {refusal}", err=True)
        sys.exit(EXIT_ERROR)
    opts = InitOptions(
        root=seam.root,
        admin=admin,
        hosts=hosts,
        pki=pki.absolute() if pki is not None else None,
        health_timeout_s=seam.health_timeout_s,
    )
    try:
        result = asyncio.run(init_control_plane(opts, system, click.echo))
    except ConfigError as exc:
        click.echo(f"llmgw: {exc}", err=True)
        sys.exit(EXIT_CONFIG)
    except (InstallError, LlmgwError) as exc:
        click.echo(f"llmgw: {exc}", err=True)
        sys.exit(EXIT_ERROR)
    for line in next_steps(result, opts):
        click.echo(line)


@attrs.frozen
class InitSeam:
    """What init acts on: this machine, or (as the click context's obj) a test's stand-in and root."""

    system: System
    root: Path
    health_timeout_s: float = HEALTH_TIMEOUT_S
