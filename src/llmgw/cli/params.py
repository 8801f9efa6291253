"""What a person types as an id or a number on the command line, read as the admin API reads it.

click's int and float read whatever Python's do: `users approve ٢` acted on
user 2 (int() reads Arabic-Indic digits), `--rpm 100000000000000000000` went on
to the store and ended in a traceback, and `--budget nan` passed every range
(NaN compares false with both ends). These take ASCII digits only, hold each
number to its bound in llmgw.maxima, and refuse anything else as a usage error
(exit 2) in a sentence naming the bound.
"""

from __future__ import annotations

from typing import Any

import click

from llmgw import maxima
from llmgw.names import id_number


class Id(click.ParamType[int]):
    """An id: ASCII digits, as many as the store's ids may have."""

    name = "id"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        number = id_number(str(value))
        if number is None:
            self.fail(f"{value!r} is not an id; an id is written in the digits 0-9", param, ctx)
        return number


class Bounded(click.ParamType[int | float]):
    """A number from least (more than it when above) to most, whole when whole is set; named what."""

    def __init__(self, what: str, most: int, *, whole: bool, least: int = 0, above: bool = False) -> None:
        self.what = what
        self.most = most
        self.whole = whole
        self.least = least
        self.above = above
        self.name = "integer" if whole else "number"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int | float:
        try:
            return maxima.read(
                str(value), self.what, self.most, whole=self.whole, least=self.least, above=self.above
            )
        except ValueError as exc:
            self.fail(str(exc), param, ctx)
