"""`llmgw`: run roles, or one of the administrative commands.

Only this package prints for the user or chooses an exit code.
"""

from __future__ import annotations

import sys
from pathlib import Path

import click

from llmgw import __version__
from llmgw.cli.exit import EXIT_CONFIG, EXIT_ERROR
from llmgw.cli.lazy import LazyCommand, LazyGroup
from llmgw.errors import ConfigError, LlmgwError

ROLES = ("server", "agent", "mirror")

# Imported only when run, so `llmgw --version` and `llmgw --help` load none of them;
# a new command goes here, with the first line of its help.
COMMANDS = {
    "bundle": LazyCommand(
        "llmgw.cli.bundle:bundle",
        "Offline sites: collect what a cluster downloads into one checked bundle, and import it.",
    ),
    "cert": LazyCommand(
        "llmgw.cli.cert:cert", "Create the certificate authority and issue server and agent certificates."
    ),
    "ctl": LazyCommand(
        "llmgw.cli.ctl:ctl", "The cluster from a shell: nodes, models, replicas, placement and a node's logs."
    ),
    "keys": LazyCommand("llmgw.cli.keys:keys", "API keys for the gateway's /v1 routes."),
    "mirror": LazyCommand(
        "llmgw.cli.mirror:mirror",
        "The model mirror: fetch models from a Hugging Face–compatible hub into its directory.",
    ),
    "orgs": LazyCommand("llmgw.cli.hierarchy:orgs", "The organisations: create, rename, list, delete."),
    "prices": LazyCommand("llmgw.cli.prices:prices", "What each model costs, kept in the store."),
    "projects": LazyCommand(
        "llmgw.cli.hierarchy:projects", "The projects: create, rename, list, delete, members, models."
    ),
    "quotas": LazyCommand(
        "llmgw.cli.quotas:quotas", "Rate limits and budgets of organisations, teams, projects and keys."
    ),
    "server": LazyCommand("llmgw.cli.server_init:server", "Set up the machine the control plane runs on."),
    "store": LazyCommand(
        "llmgw.cli.store:store",
        "The store: back it up while the server runs; bring its schema up to date; move it elsewhere.",
    ),
    "teams": LazyCommand("llmgw.cli.hierarchy:teams", "The teams: create, rename, list, delete."),
    "usage": LazyCommand(
        "llmgw.cli.usage:usage", "What was used, added up by organisation, team, project, key or model."
    ),
    "users": LazyCommand("llmgw.cli.users:users", "Accounts for the web pages (login, profile, /admin)."),
}


@click.group(
    cls=LazyGroup,
    lazy_commands=COMMANDS,
    invoke_without_command=True,
    context_settings={"help_option_names": ["-h", "--help"]},
)
@click.option(
    "--role",
    "roles",
    multiple=True,
    type=click.Choice(ROLES),
    help="Role to run; repeat it to run several roles in one process.",
)
@click.option(
    "--config",
    "configs",
    multiple=True,
    type=click.Path(path_type=Path, dir_okay=False),
    help="Configuration file, one per --role in the same order "
    "(default /etc/llmgw/ROLE.yaml; ignored with --dev).",
)
@click.option(
    "--dev", is_flag=True, help="Keep everything in --dev-dir with its own CA and a sim-chat model."
)
@click.option(
    "--dev-dir",
    type=click.Path(path_type=Path, file_okay=False),
    default=Path(".llmgw-dev"),
    show_default=True,
    help="Where --dev keeps its certificates, configuration and store.",
)
@click.option(
    "--engine",
    "engine_binaries",
    multiple=True,
    metavar="NAME=PATH",
    help="With --dev: the dev node runs this engine binary (`llamacpp=/path/to/llama-server`, "
    "`vllm=/venv/bin/vllm`), as agent.yaml `engines.NAME.binary` would; repeat for several.",
)
@click.option(
    "--install",
    "engine_installs",
    multiple=True,
    metavar="NAME[=VERSION]",
    help="With --dev: the dev node installs this engine (`llamacpp`, `vllm=0.32.0`; without a version, "
    "the one this release was checked against), as server.yaml `engines:` would; repeat for several.",
)
@click.option("--listen", help="Override the gateway's host:port (port 0 picks a free one).")
@click.option("--admin-listen", help="Override the admin listener's host:port (port 0 picks a free one).")
@click.option(
    "--drain-timeout",
    # Not a click range: held to drain_timeout_s's own check (finite, at most a year), exit 78 like it.
    type=float,
    metavar="SECONDS",
    help="Override the server's drain_timeout_s: how long the first SIGINT or SIGTERM lets "
    "in-flight work finish (without a server role, drain_timeout_s's default).",
)
@click.option(
    "--loop",
    "loop_name",
    type=click.Choice(["asyncio", "uvloop"]),
    default="asyncio",
    show_default=True,
    help="The event loop the roles run on: asyncio's own, or uvloop's (installed with llmgw[uvloop]).",
)
@click.option(
    "--log-format",
    type=click.Choice(["auto", "text", "json"]),
    default="auto",
    show_default=True,
    help="Log lines for a person (text) or a machine (json); auto chooses by whether stderr is a terminal.",
)
@click.option(
    "--log-level",
    type=click.Choice(["debug", "info", "warning", "error"]),
    default="info",
    show_default=True,
    help="The least severe log lines written.",
)
@click.version_option(__version__, "--version", prog_name="llmgw")
@click.pass_context
def main(
    ctx: click.Context,
    roles: tuple[str, ...],
    configs: tuple[Path, ...],
    dev: bool,
    dev_dir: Path,
    engine_binaries: tuple[str, ...],
    engine_installs: tuple[str, ...],
    listen: str | None,
    admin_listen: str | None,
    drain_timeout: float | None,
    loop_name: str,
    log_format: str,
    log_level: str,
) -> None:
    """Self-hosted LLM serving: the gateway and control plane (server), a node (agent), a file mirror."""
    from llmgw import log

    log.setup(level=log_level, json=None if log_format == "auto" else log_format == "json")
    if ctx.invoked_subcommand is not None:
        return
    if not roles:
        click.echo(ctx.get_help())
        ctx.exit(2)
    if (engine_binaries or engine_installs) and not dev:
        raise click.UsageError(
            "--engine and --install are for --dev; elsewhere set agent.yaml `engines.NAME.binary` "
            "or server.yaml `engines: {NAME: VERSION}`"
        )
    binaries = _pairs(engine_binaries, "--engine", "NAME=PATH", value_required=True)
    installs = _pairs(engine_installs, "--install", "NAME[=VERSION]", value_required=False)
    from llmgw.cli.serve import serve

    try:
        code = serve(
            roles=roles,
            configs=configs,
            dev=dev,
            dev_dir=dev_dir,
            engine_binaries=binaries,
            engine_installs=installs,
            listen=listen,
            admin_listen=admin_listen,
            drain_timeout=drain_timeout,
            loop=loop_name,
        )
    except (LlmgwError, BaseExceptionGroup) as exc:
        # A role that fails to start inside a task group arrives wrapped in a group;
        # the person still gets the one sentence, not a traceback.
        error = _explained(exc)
        if error is None:
            raise
        click.echo(f"llmgw: {error}", err=True)
        sys.exit(EXIT_CONFIG if isinstance(error, ConfigError) else EXIT_ERROR)
    sys.exit(code)


def _pairs(values: tuple[str, ...], flag: str, form: str, *, value_required: bool) -> dict[str, str]:
    """ "llamacpp=/bin/llama-server" -> {"llamacpp": "/bin/llama-server"}; a usage error naming the form."""
    example = "llamacpp=/usr/local/bin/llama-server" if value_required else "vllm=0.32.0"
    out = {}
    for value in values:
        name, _, rest = value.partition("=")
        if not name.strip() or (value_required and not rest.strip()):
            raise click.UsageError(f"{flag} {value!r}: write {form}, such as {flag} {example}")
        out[name.strip()] = rest.strip()
    return out


def _explained(exc: BaseException) -> LlmgwError | None:
    """The first error written for a person in exc, looking inside exception groups."""
    if isinstance(exc, LlmgwError):
        return exc
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            found = _explained(inner)
            if found is not None:
                return found
    return None
