"""How long to wait after failures in a row: one formula for every retry in llmgw.

The agent redialing its control plane, the supervisor restarting a crashed
engine, a weights download resuming, the provision loop's next pass after a
failed install and the reconciler's pause before placing a model on a node
where it failed all wait `base_s`, then `factor` times longer after each
further failure, never more than `cap_s`. With `jitter`, up to that fraction
of each wait is taken off at random, so a fleet that failed at once does not
retry at once.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable

import attrs


def _fraction(instance: object, attribute: attrs.Attribute[float], value: float) -> None:
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"{attribute.name} is a fraction of the wait, from 0 to 1, not {value}")


@attrs.frozen
class ExponentialBackoff:
    """The wait after each failure in a row: base_s, times factor per further failure, at most cap_s."""

    base_s: float
    cap_s: float = math.inf
    factor: float = 2.0
    # The fraction of each wait that may be taken off at random: 0.5 waits between half and all of it.
    jitter: float = attrs.field(default=0.0, validator=_fraction)
    # Draws a number between its two arguments; tests pass one that always says the same.
    uniform: Callable[[float, float], float] = attrs.field(default=random.uniform, eq=False, repr=False)

    def delay(self, failures: int) -> float:
        """The wait after `failures` failures in a row (1 for the first, which waits base_s)."""
        if failures < 1:
            raise ValueError(f"a wait follows a failure; got {failures} failures")
        try:
            wait = self.base_s * self.factor ** (failures - 1)
        except OverflowError:
            # An agent that has redialed for days: past any cap long ago.
            wait = math.inf
        wait = min(wait, self.cap_s)
        if self.jitter:
            return self.uniform(wait * (1.0 - self.jitter), wait)
        return wait
