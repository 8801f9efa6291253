"""`llmgw quotas`: rate limits and budgets of organisations, teams, projects and keys.

A request is admitted only if every scope of its key's chain (the key, its
project, team and organisation) has room; a running gateway applies a change
within a second.
"""

from __future__ import annotations

from pathlib import Path

import click

from llmgw.catalog import Catalog
from llmgw.cli.hierarchy import echo_rows
from llmgw.cli.params import Bounded
from llmgw.cli.store_command import server_config_option, with_config, with_store
from llmgw.config import ServerConfig
from llmgw.maxima import MAX_BUDGET, MAX_PER_MINUTE, said
from llmgw.store import Store
from llmgw.store.quotas import PERIODS
from llmgw.tenancy import operations as tenancy
from llmgw.tenancy import views as tv

_config_option = server_config_option("limits and budgets")
_SCOPE_HELP = "SCOPE is org:NAME, team:NAME, project:NAME (an id works for a name) or key:PREFIX."


def _limit(value: int | None) -> str:
    return "-" if value is None else str(value)


def describe(quota: tv.Quota) -> str:
    """One line for a person: "project 'web' (…): 60 rpm, no tpm limit, 10 per month"."""
    parts = [
        "no rpm limit" if quota.rpm is None else f"{quota.rpm} rpm",
        "no tpm limit" if quota.tpm is None else f"{quota.tpm} tpm",
        "no budget"
        if quota.budget is None
        else f"a budget of {quota.budget:g} "
        + ("in total" if quota.period == "total" else f"per {quota.period}"),
    ]
    return f"{quota.name}: {', '.join(parts)}"


@click.group()
def quotas() -> None:
    """Rate limits and budgets of organisations, teams, projects and keys."""


@quotas.command("set")
@click.argument("scope")
@click.option(
    "--rpm",
    type=Bounded("rpm", MAX_PER_MINUTE, whole=True),
    help=f"Requests per minute, 0 (refuses every request) to {said(MAX_PER_MINUTE)}.",
)
@click.option(
    "--tpm",
    type=Bounded("tpm", MAX_PER_MINUTE, whole=True),
    help=f"Tokens per minute, prompt and completion together, 0 to {said(MAX_PER_MINUTE)}.",
)
@click.option(
    "--budget",
    type=Bounded("the budget", MAX_BUDGET, whole=False),
    metavar="AMOUNT",
    help=f"Money per --period, in the unit of the prices, 0 to {said(MAX_BUDGET)}.",
)
@click.option(
    "--period",
    type=click.Choice(PERIODS),
    help="How often the budget renews (UTC days, weeks from Monday, months) or total; needed with a "
    "first --budget.",
)
@_config_option
def set_(
    scope: str, rpm: int | None, tpm: int | None, budget: float | None, period: str | None, config_path: Path
) -> None:
    """Set SCOPE's limits and budget; what is not given stays as it was."""
    if rpm is None and tpm is None and budget is None and period is None:
        raise click.UsageError("say what to set: --rpm, --tpm, or --budget with --period")

    async def run(cfg: ServerConfig, store: Store) -> tv.Quota:
        quota = await tenancy.set_quota(
            store,
            scope,
            rpm=tenancy.KEEP if rpm is None else rpm,
            tpm=tenancy.KEEP if tpm is None else tpm,
            budget=tenancy.KEEP if budget is None else budget,
            period=period,
        )
        if budget is None and period is None:
            return quota
        catalog = await Catalog.open(cfg, store)
        return await tenancy.with_unpriced(store, cfg, catalog.models(), quota)

    quota = with_config(config_path, run)
    click.echo(describe(quota) + "; a running gateway applies it within a second")
    if quota.unpriced:
        click.echo(f"warning: {quota.unpriced}", err=True)


set_.help = f"{set_.help} {_SCOPE_HELP}"


@quotas.command("list")
@_config_option
def list_(config_path: Path) -> None:
    """Every scope with a limit or a budget."""
    found = with_store(config_path, tenancy.quotas)
    rows = [
        [
            q.scope,
            q.name,
            _limit(q.rpm),
            _limit(q.tpm),
            "-" if q.budget is None else f"{q.budget:g}",
            q.period or "-",
        ]
        for q in found
    ]
    echo_rows(
        ["SCOPE", "NAME", "RPM", "TPM", "BUDGET", "PERIOD"],
        rows,
        "no limits or budgets are set; `llmgw quotas set SCOPE` sets one",
    )


@quotas.command("clear")
@click.argument("scope")
@_config_option
def clear(scope: str, config_path: Path) -> None:
    """Remove SCOPE's limits and budget; the scopes above it still apply."""
    quota = with_store(config_path, lambda store: tenancy.clear_quota(store, scope))
    click.echo(f"{quota.name} sets no limit or budget now; a running gateway applies it within a second")


clear.help = f"{clear.help} {_SCOPE_HELP}"
