"""`llmgw ctl engine-check ENGINE [--bin PATH]`: run on the node, not through the admin API.

It answers the question a person has after building or upgrading an engine
by hand: will a replica placed here start, or will the engine refuse a flag
llmgw passes it? The check itself is llmgw.engines.check; this prints it.
"""

from __future__ import annotations

import asyncio
import sys
from typing import NoReturn

import attrs
import click

from llmgw import strictjson
from llmgw.cli.exit import EXIT_ERROR, EXIT_NOT_FOUND, EXIT_USAGE
from llmgw.engines.check import BinaryNotFoundError, EngineCheck, EngineCheckError, check_engine
from llmgw.errors import LlmgwError


def _fail(message: str, code: int) -> NoReturn:
    click.echo(f"llmgw ctl engine-check: {message}", err=True)
    sys.exit(code)


@click.command("engine-check")
@click.argument("engine")
@click.option(
    "--bin",
    "binary",
    default="",
    metavar="PATH",
    help="The binary to check (for sglang, the interpreter); default: the adapter's, from the PATH.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON instead of lines.")
@click.pass_context
def engine_check(ctx: click.Context, engine: str, binary: str, as_json: bool) -> None:
    """Run ENGINE's --help and --version on this machine; list each flag llmgw passes it that it lacks.

    Exit codes: 0 every flag is accepted and the version was read; 1 a flag is missing, or the
    binary's help or version could not be read; 2 no such engine; 4 no such binary.
    """
    from llmgw.engines.registry import get_engine

    # ctl's own --json, given before the subcommand, means the same.
    as_json = as_json or bool(ctx.parent is not None and ctx.parent.params.get("as_json"))
    try:
        adapter = get_engine(engine)
    except LlmgwError as exc:
        _fail(str(exc), EXIT_USAGE)
    try:
        result = asyncio.run(check_engine(engine, adapter, binary))
    except EngineCheckError as exc:
        _fail(str(exc), EXIT_NOT_FOUND if isinstance(exc, BinaryNotFoundError) else EXIT_ERROR)
    if as_json:
        click.echo(strictjson.dumps({**attrs.asdict(result), "ok": result.ok}, indent=2, sort_keys=True))
    else:
        _print(result)
    if not result.ok:
        sys.exit(EXIT_ERROR)


def _print(result: EngineCheck) -> None:
    click.echo(f"engine   {result.engine}")
    click.echo(f"binary   {result.binary}")
    click.echo(f"version  {result.version or result.version_error}")
    click.echo(f"passes   {' '.join(result.flags)}")
    for flag in result.missing:
        click.echo(f"missing  {flag}: llmgw passes it and `{result.help_command}` does not mention it")
    if result.missing:
        count = len(result.missing)
        click.echo(
            f"\n{result.engine} would refuse {count} flag{'s' if count > 1 else ''} llmgw passes: "
            "a replica of it would fail at start. Use a build that accepts them "
            "(docs/engines.md lists what each flag is for)."
        )
    elif result.version_error:
        click.echo(
            f"\nevery flag llmgw passes is in `{result.help_command}`, but its version could not be read"
        )
    else:
        click.echo(f"\nok: every flag llmgw passes is in `{result.help_command}`")
