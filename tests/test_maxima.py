"""The bounds on what a person or a client sets: far above any use, far below where arithmetic fails."""

from __future__ import annotations

import math
import sys

import pytest

from llmgw import maxima
from llmgw.config import PriceConfig
from llmgw.gateway.admission import TEMPLATE_OVERHEAD
from llmgw.gateway.app import MAX_BODY
from llmgw.gateway.prompts import MOST_PROMPT_TOKENS
from llmgw.pricing import cost


def test_the_dearest_request_costs_a_finite_amount_even_summed_over_every_row_a_store_holds() -> None:
    """A request is charged for at most the most prompt any request reserves and its model's max_tokens."""
    dearest = PriceConfig(prompt_per_1k=maxima.MAX_PRICE_PER_1K, completion_per_1k=maxima.MAX_PRICE_PER_1K)
    # Reckoned, as the usage tests reckon it, as a token per byte of the largest body.
    assert MOST_PROMPT_TOKENS == MAX_BODY + TEMPLATE_OVERHEAD
    most = cost(dearest, MOST_PROMPT_TOKENS, maxima.MAX_TOKENS)
    assert math.isfinite(most) and most * 2**63 < sys.float_info.max


def test_a_rate_or_a_budget_fits_the_stores_integers_and_a_float_exactly() -> None:
    for most in (maxima.MAX_PER_MINUTE, maxima.MAX_BUDGET):
        assert most < 2**53 and float(most) == most


class TestProblem:
    @pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf, -1, 10**12 + 1, 1e20, 10**20])
    def test_a_value_outside_0_to_the_bound_is_refused_naming_the_bound(self, value: float) -> None:
        said = maxima.problem("rpm", value, 10**12, whole=True)
        assert said is not None and said.startswith("rpm is ")
        assert said.endswith("it must be a whole number from 0 to 1,000,000,000,000")

    @pytest.mark.parametrize("value", [0, 0.0, 10**12, 1e12])
    def test_the_ends_are_taken(self, value: float) -> None:
        assert maxima.problem("rpm", value, 10**12, whole=True) is None


class TestRead:
    @pytest.mark.parametrize(
        ("text", "number"), [("60", 60), (" 60 ", 60), ("1e12", 10**12), ("0.5", 0.5), (".5", 0.5), ("+3", 3)]
    )
    def test_a_number_written_in_ascii_is_read(self, text: str, number: float) -> None:
        whole = isinstance(number, int)
        read = maxima.read(text, "x", 10**12, whole=whole)
        assert read == number and type(read) is type(number)

    @pytest.mark.parametrize(
        "text",
        [
            "\u0662",
            "\u0661\u0660",
            "\uff12",
            "\u00b2",
            "1_000",
            "inf",
            "nan",
            "-inf",
            "0x10",
            "",
            "1e",
            "1.2.3",
        ],
    )
    def test_anything_else_is_refused_in_a_sentence(self, text: str) -> None:
        """int() and float() read other scripts' digits ("٢" is 2), underscores, inf and nan."""
        with pytest.raises(ValueError, match=r"^x is '.*'; write a number from 0 to 10$"):
            maxima.read(text, "x", 10, whole=False)

    def test_a_long_whole_number_keeps_every_digit(self) -> None:
        """float() would round 10**20 + 1, and the refusal would name another number."""
        with pytest.raises(ValueError, match=r"^rpm is 1e\+20; it must be a whole number"):
            maxima.read("100000000000000000001", "rpm", 10**12, whole=True)
        assert maxima.read("999999999999", "rpm", 10**12, whole=True) == 999_999_999_999

    def test_a_fraction_is_not_a_whole_number(self) -> None:
        with pytest.raises(ValueError, match=r"^rpm is 1.5; write a whole number from 0 to 10$"):
            maxima.read("1.5", "rpm", 10, whole=True)
