"""The one backoff formula: base, doubling per failure in a row, capped, optionally jittered."""

from __future__ import annotations

import math

import pytest

from llmgw.backoff import ExponentialBackoff


def _lowest(low: float, high: float) -> float:
    return low


def _highest(low: float, high: float) -> float:
    return high


class TestExponentialBackoff:
    def test_the_first_failure_waits_the_base_and_each_further_one_doubles_it(self) -> None:
        backoff = ExponentialBackoff(base_s=1.0, cap_s=30.0)
        assert [backoff.delay(n) for n in range(1, 8)] == [1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0]

    def test_the_factor_sets_how_fast_the_wait_grows(self) -> None:
        backoff = ExponentialBackoff(base_s=0.5, cap_s=100.0, factor=3.0)
        assert [backoff.delay(n) for n in range(1, 5)] == [0.5, 1.5, 4.5, 13.5]

    def test_without_a_cap_the_wait_keeps_growing(self) -> None:
        assert ExponentialBackoff(base_s=1.0).delay(11) == 1024.0

    def test_a_failure_count_past_any_float_still_waits_the_cap(self) -> None:
        """An agent redialing a control plane that stays down for days must not overflow its wait."""
        assert ExponentialBackoff(base_s=0.5, cap_s=30.0).delay(5000) == 30.0
        assert ExponentialBackoff(base_s=1.0).delay(5000) == math.inf

    def test_jitter_takes_up_to_its_fraction_off_each_wait(self) -> None:
        low = ExponentialBackoff(base_s=1.0, cap_s=30.0, jitter=0.5, uniform=_lowest)
        high = ExponentialBackoff(base_s=1.0, cap_s=30.0, jitter=0.5, uniform=_highest)
        assert [low.delay(n) for n in (1, 3, 10)] == [0.5, 2.0, 15.0]
        assert [high.delay(n) for n in (1, 3, 10)] == [1.0, 4.0, 30.0]

    def test_jittered_waits_differ_from_one_another(self) -> None:
        """A fleet that failed at once must not retry at once."""
        backoff = ExponentialBackoff(base_s=1.0, cap_s=30.0, jitter=0.5)
        waits = [backoff.delay(3) for _ in range(200)]
        assert all(2.0 <= wait <= 4.0 for wait in waits)
        assert len(set(waits)) > 100

    def test_without_jitter_the_random_source_is_never_asked(self) -> None:
        def refuse(low: float, high: float) -> float:
            raise AssertionError("asked for a random wait without jitter")

        assert ExponentialBackoff(base_s=2.0, cap_s=5.0, uniform=refuse).delay(2) == 4.0

    def test_a_wait_before_any_failure_is_refused(self) -> None:
        with pytest.raises(ValueError, match="follows a failure"):
            ExponentialBackoff(base_s=1.0).delay(0)

    @pytest.mark.parametrize("jitter", [-0.1, 1.5])
    def test_a_jitter_outside_zero_to_one_is_refused(self, jitter: float) -> None:
        with pytest.raises(ValueError, match="fraction of the wait"):
            ExponentialBackoff(base_s=1.0, jitter=jitter)
