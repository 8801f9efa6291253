"""A node judged for one profile of a model: a candidate, or the one reason it is not.

Apart from the scheduler (control/placement.py) so that the one-line summary
of those verdicts (control/summary.py) reads them without importing it back.
"""

from __future__ import annotations

import attrs

# The kinds of reason. A node gets the first that applies: the hard constraints first (labels,
# GPU class, total memory, a fabric), then its state and engine, then what placed replicas use.
STATE = "state"
ENGINE = "engine"
GPU_CLASS = "gpu_class"
CARDS = "cards"
MEMORY = "memory"
FABRIC = "fabric"
LABEL = "label"
# The model's replica failed on the node lately (the reconciler's backoff, per model and node).
BACKOFF = "backoff"
# The profile failed on the node the same way several times in a row (control/failures.py): given up
# there until the model's definition changes or the node's agent registers again.
GIVEN_UP = "given_up"


@attrs.frozen
class Verdict:
    """One node judged for one profile of a model: a candidate, or the one reason it is not."""

    profile: str
    node: str
    # Empty for a candidate; otherwise a phrase that follows the node's name: "is unreachable".
    reason: str = ""
    kind: str = ""
    # The node can never take the profile whatever its state (labels, GPU class, memory, fabric):
    # a summary counts such nodes last, and never blames their state for the model.
    hard: bool = False

    @property
    def candidate(self) -> bool:
        return not self.reason

    def __str__(self) -> str:
        return f"node {self.node} {self.reason or 'is a candidate'} (profile {self.profile})"
