"""What a model costs, and which models have no price: budgets never bind on those.

Below the gateway, tenancy and the admin API alike: admission charges with it,
`llmgw quotas set` and the quotas page warn with it, `ctl models` flags with it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from llmgw.config import ModelConfig, PriceConfig, ServerConfig
from llmgw.store.quotas import Budget


def price_of(
    cfg: ServerConfig,
    model: str,
    definition: ModelConfig | None = None,
    stored: Mapping[str, PriceConfig] | None = None,
) -> PriceConfig | None:
    """The model's price: one set with `llmgw prices set` (stored), its definition's `pricing`, its
    `pricing` entry, else `default_price` unless that is zero; None: no price."""
    if stored is not None and model in stored:
        return stored[model]
    if definition is not None and definition.pricing is not None:
        return definition.pricing
    price = cfg.pricing.get(model)
    if price is not None:
        return price
    default = cfg.default_price
    if default.prompt_per_1k or default.completion_per_1k:
        return default
    return None


def cost(price: PriceConfig | None, prompt_tokens: int, completion_tokens: int) -> float:
    if price is None:
        return 0.0
    return (prompt_tokens * price.prompt_per_1k + completion_tokens * price.completion_per_1k) / 1000


def budget_warnings(
    cfg: ServerConfig,
    budgets: Sequence[Budget],
    models: Sequence[ModelConfig],
    stored: Mapping[str, PriceConfig] | None = None,
) -> list[str]:
    """A sentence for every model of models (the live catalog's) no price applies to, when budgets are set.

    Logged at start; the quotas page shows them too.
    """
    if not budgets:
        return []
    return [
        f"budgets are set but no price applies to {name}: they never bind"
        for name in unpriced(cfg, models, stored)
    ]


def unpriced(
    cfg: ServerConfig, models: Sequence[ModelConfig], stored: Mapping[str, PriceConfig] | None = None
) -> list[str]:
    """The names of the models no price applies to (stored prices count): budgets never bind on them."""
    return [model.name for model in models if price_of(cfg, model.name, model, stored) is None]


def unpriced_sentence(names: Sequence[str]) -> str:
    """What setting a budget means while names have no price, said where it is set."""
    one = len(names) == 1
    them = names[0] if one else ", ".join(names[:-1]) + f" and {names[-1]}"
    return (
        f"no price applies to {them}, so budgets never bind on what {'it serves' if one else 'they serve'}; "
        f"give {'it' if one else 'each'} `pricing` (in server.yaml or the model's definition) "
        "or set `default_price`"
    )
