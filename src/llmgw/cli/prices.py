"""`llmgw prices`: what each model costs, kept in the store and before server.yaml's prices."""

from __future__ import annotations

from pathlib import Path

import click

from llmgw.catalog import Catalog
from llmgw.cli.hierarchy import echo_rows
from llmgw.cli.params import Bounded
from llmgw.cli.store_command import server_config_option, with_config
from llmgw.config import ServerConfig
from llmgw.maxima import MAX_PRICE_PER_1K, said
from llmgw.store import Store
from llmgw.tenancy import operations as tenancy
from llmgw.tenancy import views as tv

_config_option = server_config_option("prices")
_SOURCES = {
    "set": "llmgw prices set",
    "model": "the model's definition",
    "pricing": "server.yaml pricing",
    "default": "server.yaml default_price",
    "none": "nothing: free, and budgets never bind",
}


def _per_1k(value: float | None) -> str:
    return "-" if value is None else f"{value:g}"


@click.group()
def prices() -> None:
    """What each model costs, kept in the store."""


@prices.command("set")
@click.argument("model")
@click.option(
    "--prompt-per-1k",
    "prompt",
    type=Bounded("the prompt price", MAX_PRICE_PER_1K, whole=False),
    required=True,
    metavar="X",
    help=f"The price of 1,000 prompt tokens, in the unit budgets are set in: 0 to {said(MAX_PRICE_PER_1K)}.",
)
@click.option(
    "--completion-per-1k",
    "completion",
    type=Bounded("the completion price", MAX_PRICE_PER_1K, whole=False),
    required=True,
    metavar="Y",
    help=f"The price of 1,000 completion tokens: 0 to {said(MAX_PRICE_PER_1K)}.",
)
@_config_option
def set_(model: str, prompt: float, completion: float, config_path: Path) -> None:
    """Price MODEL, before server.yaml's prices; a running gateway charges it within a second."""

    async def run(cfg: ServerConfig, store: Store) -> tuple[tv.Price, bool]:
        catalog = await Catalog.open(cfg, store)
        price = await tenancy.set_price(store, cfg, catalog.models(), model, prompt, completion)
        return price, catalog.get(model) is not None

    price, known = with_config(config_path, run)
    click.echo(
        f"{price.model} costs {_per_1k(price.prompt_per_1k)} per 1k prompt tokens and "
        f"{_per_1k(price.completion_per_1k)} per 1k completion tokens; "
        "a running gateway charges it within a second"
    )
    if not known:
        # A price set ahead of the model is kept; a typo is kept too, so say so.
        click.echo(f"note: the catalog has no model {model} yet; the price applies once it does", err=True)


@prices.command("clear")
@click.argument("model")
@_config_option
def clear(model: str, config_path: Path) -> None:
    """Forget the price set for MODEL; server.yaml's applies again."""

    async def run(cfg: ServerConfig, store: Store) -> tv.Price:
        catalog = await Catalog.open(cfg, store)
        return await tenancy.clear_price(store, cfg, catalog.models(), model)

    price = with_config(config_path, run)
    click.echo(f"{price.model} now takes its price from {_SOURCES[price.source]}")


@prices.command("list")
@_config_option
def list_(config_path: Path) -> None:
    """Every model's price and where it comes from."""

    async def run(cfg: ServerConfig, store: Store) -> list[tv.Price]:
        catalog = await Catalog.open(cfg, store)
        return await tenancy.prices(store, cfg, catalog.models())

    found = with_config(config_path, run)
    rows = [
        [p.model, _per_1k(p.prompt_per_1k), _per_1k(p.completion_per_1k), _SOURCES[p.source]] for p in found
    ]
    echo_rows(["MODEL", "PROMPT/1K", "COMPLETION/1K", "FROM"], rows, "no models and no prices")
