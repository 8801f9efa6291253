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
@click.option(
    "--bundle",
    type=click.Path(path_type=Path, exists=True),
    help="An offline bundle (`llmgw bundle create`) to import into this machine's mirror, "
    "pointing server.yaml's engine_mirror at it; needs --sha256.",
)
@click.option("--sha256", "bundle_sha256", metavar="HEX", help="The bundle's manifest sha256, carried apart.")
@click.option(
    "--mirror-url",
    metavar="URL",
    default="",
    help="Where nodes reach the mirror's files "
    "[default: server.yaml's mirror.url, else http://ADDRESS:PORT, the first --host or else the machine's "
    "first address, and mirror.yaml's port].",
)
@click.pass_obj
def init(
    obj: object,
    admin: str | None,
    hosts: tuple[str, ...],
    pki: Path | None,
    bundle: Path | None,
    bundle_sha256: str | None,
    mirror_url: str,
) -> None:
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
    if bundle is not None and not bundle_sha256:
        click.echo(
            "llmgw: --bundle needs --sha256, the manifest's sha256 `llmgw bundle create` printed", err=True
        )
        sys.exit(EXIT_ERROR)
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
        bundle=bundle.absolute() if bundle is not None else None,
        bundle_sha256=bundle_sha256 or "",
        mirror_url=mirror_url,
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
