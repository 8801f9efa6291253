"""`llmgw usage`: what was used, added up by organisation, team, project, key or model."""

from __future__ import annotations

from datetime import date, datetime
from pathlib import Path
from typing import cast

import click

from llmgw import strictjson
from llmgw.adminapi.views import CONVERTER
from llmgw.cli.hierarchy import echo_rows
from llmgw.cli.store_command import server_config_option, with_store
from llmgw.store.usage import USAGE_BY, UsageBy
from llmgw.tenancy import operations as tenancy

_DAY = click.DateTime(["%Y-%m-%d"])


def _day(value: datetime | None) -> date | None:
    return value.date() if value is not None else None


@click.command()
@click.option(
    "--by", type=click.Choice(USAGE_BY), default="project", show_default=True, help="What to add up by."
)
@click.option(
    "--since", type=_DAY, metavar="DATE", help="The first day counted, YYYY-MM-DD (UTC) [default: the first]."
)
@click.option(
    "--until", type=_DAY, metavar="DATE", help="The last day counted, YYYY-MM-DD (UTC) [default: today]."
)
@click.option(
    "--format",
    "output",
    type=click.Choice(["table", "csv", "json"]),
    default="table",
    show_default=True,
    help="A table for a person, CSV for a spreadsheet, JSON for a script.",
)
@server_config_option("usage records")
def usage(by: str, since: datetime | None, until: datetime | None, output: str, config_path: Path) -> None:
    """What was used, added up by organisation, team, project, key or model."""
    rows = with_store(
        config_path,
        lambda store: tenancy.usage(store, cast(UsageBy, by), _day(since), _day(until)),
    )
    if output == "csv":
        click.echo(tenancy.usage_csv(rows), nl=False)
        return
    if output == "json":
        click.echo(strictjson.dumps(CONVERTER.unstructure(rows), indent=2))
        return
    table = [
        [
            r.name,
            str(r.requests),
            str(r.errors),
            str(r.prompt_tokens),
            str(r.completion_tokens),
            str(r.total_tokens),
            f"{r.cost:.4f}",
        ]
        for r in rows
    ]
    if rows:
        table.append(
            [
                "TOTAL",
                str(sum(r.requests for r in rows)),
                str(sum(r.errors for r in rows)),
                str(sum(r.prompt_tokens for r in rows)),
                str(sum(r.completion_tokens for r in rows)),
                str(sum(r.total_tokens for r in rows)),
                f"{sum(r.cost for r in rows):.4f}",
            ]
        )
    echo_rows(
        [by.upper(), "REQUESTS", "ERRORS", "PROMPT", "COMPLETION", "TOTAL TOKENS", "COST"],
        table,
        "no usage in these days",
    )
