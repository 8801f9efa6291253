"""Whether one replica's estimate fits, node by node and profile by profile, and why not in words.

"needs 21.4 GB of GPU memory per card at context 8192 × 4; fits on n1, n2
(h100-80g); n7 has 16.0 GB free on its best card". A replica on GPUs splits
its weights and cache evenly over its cards (tensor parallel): each card of a
profile's `gpus_per_node` × `nodes` needs its share. One without GPUs needs it
all in the node's free RAM.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import attrs

from llmgw.capacity.estimate import Estimate, gigabytes
from llmgw.capacity.fleet import Card, NodeCapacity, ProfileShape


@attrs.frozen
class NodeFit:
    node: str
    fits: bool
    reason: str
    # The cards it would take, when it fits on GPUs.
    cards: list[int] = attrs.field(factory=list)


@attrs.frozen
class ProfileFit:
    profile: str
    engine: str
    estimate: Estimate
    # Cards one replica spans (0: in RAM) and each one's share of the estimate.
    cards: int
    per_card_bytes: int
    summary: str
    nodes: list[NodeFit]


def cards_needed(profile: ProfileShape) -> int:
    """Cards per node, as placement counts them: gpus_per_node, or 1 when only a class is named."""
    if profile.gpus_per_node > 0:
        return profile.gpus_per_node
    return 1 if profile.gpu_class else 0


def judge(estimate: Estimate, profile: ProfileShape | None, nodes: Sequence[NodeCapacity]) -> ProfileFit:
    """Every node for one profile (None: any cards a node has, fewest first, else its RAM)."""
    name = profile.name if profile is not None else "(any)"
    per_node = cards_needed(profile) if profile is not None else 0
    span = profile.nodes if profile is not None else 1
    if profile is not None and per_node == 0:
        fits = [_in_ram(estimate, n) for n in nodes]
        return _summed(name, estimate, 0, estimate.total_bytes, fits, "of RAM")
    if profile is not None:
        per_card = math.ceil(estimate.total_bytes / (per_node * span))
        fits = [_on_cards(per_card, per_node, profile.gpu_class, n) for n in nodes]
        return _summed(name, estimate, per_node * span, per_card, fits, "of GPU memory per card")
    fits = [_any(estimate, n) for n in nodes]
    return _summed(name, estimate, 0, estimate.total_bytes, fits, "")


def _summed(
    name: str, estimate: Estimate, cards: int, per_card: int, fits: list[NodeFit], where: str
) -> ProfileFit:
    at = f"at context {estimate.context} × {estimate.parallel}"
    need = f"needs {gigabytes(per_card)} {where} {at}" if where else f"needs {gigabytes(per_card)} {at}"
    if cards > 1:
        need += f" ({cards} cards, {gigabytes(estimate.total_bytes)} in all)"
    ok = [f.node for f in fits if f.fits]
    parts = [need.replace("  ", " "), f"fits on {', '.join(ok)}" if ok else "fits on no node"]
    parts += [f"{f.node} {f.reason}" for f in fits if not f.fits]
    return ProfileFit(
        profile=name,
        engine=estimate.engine,
        estimate=estimate,
        cards=cards,
        per_card_bytes=per_card,
        summary="; ".join(parts),
        nodes=fits,
    )


def _in_ram(estimate: Estimate, node: NodeCapacity) -> NodeFit:
    if node.memory_available_mb is None:
        return NodeFit(node.id, False, "has not reported its memory")
    free = node.memory_available_mb << 20
    if free < estimate.total_bytes:
        return NodeFit(node.id, False, f"has {gigabytes(free)} of RAM free")
    return NodeFit(node.id, True, f"fits in RAM ({gigabytes(free)} free)")


def _usable(node: NodeCapacity, gpu_class: str) -> list[Card]:
    cards = [c for c in node.cards if c.usable and (not gpu_class or c.gpu_class == gpu_class)]
    return sorted(cards, key=lambda c: (-c.free_bytes, c.index))


def _on_cards(per_card: int, count: int, gpu_class: str, node: NodeCapacity) -> NodeFit:
    of_class = [c for c in node.cards if not gpu_class or c.gpu_class == gpu_class]
    what = f"{gpu_class} " if gpu_class else ""
    if not of_class:
        return NodeFit(node.id, False, f"has no {what}GPU")
    usable = _usable(node, gpu_class)
    if len(usable) < count:
        return NodeFit(
            node.id, False, f"has {len(usable)} free {what}GPU(s) of {len(of_class)}, {count} needed"
        )
    taken = usable[:count]
    if taken[-1].free_bytes < per_card:
        best = f"{gigabytes(taken[0].free_bytes)} free" + (" on its best card" if len(usable) > 1 else "")
        if count > 1:
            best = f"{gigabytes(taken[-1].free_bytes)} free on its {_nth(count)} best card"
        return NodeFit(node.id, False, f"has {best}")
    return NodeFit(
        node.id,
        True,
        f"fits on {count} of its {len(usable)} free {what}card(s) "
        f"({gigabytes(taken[-1].free_bytes)} free each)",
        [c.index for c in taken],
    )


def _any(estimate: Estimate, node: NodeCapacity) -> NodeFit:
    """Fewest cards of one class that hold an even share each; a node without cards, its RAM."""
    if not node.cards:
        return _in_ram(estimate, node)
    classes = sorted({c.gpu_class for c in node.cards})
    for count in range(1, len(node.cards) + 1):
        for cls in classes:
            usable = _usable(node, cls)
            per_card = math.ceil(estimate.total_bytes / count)
            if len(usable) >= count and usable[count - 1].free_bytes >= per_card:
                return NodeFit(
                    node.id,
                    True,
                    f"fits on {count} of its {len(usable)} free {cls} card(s), {gigabytes(per_card)} each",
                    [c.index for c in usable[:count]],
                )
    usable = [c for c in node.cards if c.usable]
    free = sum(c.free_bytes for c in usable)
    together = " on all its GPUs together" if len(usable) > 1 else ""
    return NodeFit(node.id, False, f"has {gigabytes(free)} free{together}")


def _nth(n: int) -> str:
    return {2: "2nd", 3: "3rd"}.get(n, f"{n}th")
