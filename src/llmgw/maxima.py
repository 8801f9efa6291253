"""The most llmgw takes of each number a person or a client sets: rates, budgets, prices, tokens.

A rate of 1e20 reached SQLite, which holds 64-bit integers, and was a 500 with
an OverflowError; a price of 1e308 was taken, one long prompt then cost `inf`,
and the usage API answered `"cost": Infinity`, which is not JSON. Each bound
here is far above any real use and far below where the store or a float's
arithmetic gives up: the dearest price times the most tokens a request can be
charged for, summed over every request a store could hold, is still a finite
number. The admin API (and its document), the CLI's options, the pages' forms,
server.yaml's checks and the store all hold to the same figures, and the docs
say them.
"""

from __future__ import annotations

import math
import re

# Requests or tokens per minute, of a scope's limit or server.yaml's default_rpm and default_tpm.
MAX_PER_MINUTE = 10**12
# A budget, in the unit of the prices.
MAX_BUDGET = 10**12
# The price of 1,000 prompt or completion tokens.
MAX_PRICE_PER_1K = 10**6
# The completion tokens a model may allow one request (a model's max_tokens).
MAX_TOKENS = 10**8
# A model's definition (server.yaml, or `llmgw ctl model add` through the admin API): replicas
# kept, nodes one replica spans, GPUs and memory it takes of each, requests in flight.
MAX_REPLICAS = 10_000
MAX_NODES_PER_REPLICA = 10_000
MAX_GPUS_PER_NODE = 1_024
MAX_MEMORY_MB = 10**9
MAX_IN_FLIGHT = 1_000_000
# An on-demand model's `scale.priority`: which idle replicas make room first.
MAX_PRIORITY = 1_000
# An upgrade's trial: the seconds a new agent has to register (a day; the stream carries 32 bits).
MAX_TRIAL_S = 86_400
# Nodes an upgrade restarts at once; more than any fleet has.
MAX_NODES_AT_ONCE = 100_000
# `llmgw ctl bench`: requests in flight at once, a prompt's tokens, seconds a level is held.
MAX_CONCURRENCY = 10_000
MAX_PROMPT_TOKENS = 1_000_000
MAX_BENCH_SECONDS = 86_400
# `llmgw ctl model plan`: sequences served at once.
MAX_PARALLEL = 100_000

# A number as a person writes one in ASCII: 60, 0.5, .5, 1e6; float() alone also took "١٠", "inf"
# and "nan", and int() "٢" and "1_000".
_NUMBER = re.compile(r"[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?")
_WHOLE = re.compile(r"[+-]?[0-9]+")


def said(value: float) -> str:
    """1,000,000,000,000 rather than 1e+12: the bound as a person reads it."""
    return f"{int(value):,}" if float(value).is_integer() else f"{value:g}"


def allowed(most: float, *, whole: bool, least: int = 0, above: bool = False) -> str:
    """What a field takes, for a refusal and the docs: "a whole number from 0 to 1,000"."""
    kind = "a whole number" if whole else "a number"
    if above:
        return f"{kind} more than {least} and at most {said(most)}"
    return f"{kind} from {least} to {said(most)}"


def problem(
    name: str, value: float, most: float, *, whole: bool, least: int = 0, above: bool = False
) -> str | None:
    """Why value is not one name takes (from least, or more than it when above, to most), in a
    sentence; None when it is.

    Not-a-number compares false with everything, so it is refused by name rather than by range.
    """
    if isinstance(value, float) and not math.isfinite(value):
        return f"{name} is {value}; it must be {allowed(most, whole=whole, least=least, above=above)}"
    if value < least or (above and value == least) or value > most:
        return f"{name} is {_shown(value)}; it must be {allowed(most, whole=whole, least=least, above=above)}"
    return None


def _shown(value: float) -> str:
    """value as sent, short: 1e+20 for a long integer, 1000000.5 rather than g's 1e+06."""
    if isinstance(value, int):
        return f"{value:g}" if abs(value) > 10**15 else str(value)
    return repr(value).removesuffix(".0")


def read(text: str, name: str, most: int, *, whole: bool, least: int = 0, above: bool = False) -> int | float:
    """text, as a person typed it (a form's field, an option), as a number from least to most.

    ValueError, in a sentence naming the bound, when it is not one.
    """
    text = text.strip()
    if not _NUMBER.fullmatch(text):
        raise ValueError(f"{name} is {text!r}; write {allowed(most, whole=whole, least=least, above=above)}")
    number: int | float = float(text)
    if whole:
        if not (math.isfinite(number) and float(number).is_integer()):
            raise ValueError(
                f"{name} is {text}; write {allowed(most, whole=whole, least=least, above=above)}"
            )
        # int(text) keeps every digit of a long integer, which float() would round.
        number = int(text) if _WHOLE.fullmatch(text) else int(number)
    said_ = problem(name, number, most, whole=whole, least=least, above=above)
    if said_ is not None:
        raise ValueError(said_)
    return number
