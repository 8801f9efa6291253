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
        fits = [_on_cards(per_card, per_node, profile.gpu_class, n, estimate.claim) for n in nodes]
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
    parts = [need.replace("  ", " ")]
    if estimate.claim:
        whose = {"of RAM": "the node's memory", "": "each card's memory, or without cards the node's"}
        of = whose.get(where, "each card's memory")
        parts.append(
            f"vLLM takes {estimate.claim:.0%} of {of} at start "
            f"(--gpu-memory-utilization {estimate.claim:g}), its KV cache all that the rest leaves"
        )
    if estimate.kv_tokens:
        parts.append(_fixed_cache(estimate))
    parts.append(f"fits on {', '.join(ok)}" if ok else "fits on no node")
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


def _fixed_cache(estimate: Estimate) -> str:
    """What a KV cache of set bytes holds, against the context and sequences asked."""
    held = f"its KV cache is set to {gigabytes(estimate.kv_bytes)}: {estimate.kv_tokens:,} tokens"
    if estimate.kv_tokens < estimate.context:
        return f"{held}, less than one sequence of {estimate.context:,}: vLLM refuses to start"
    at_once = estimate.kv_tokens // estimate.context
    return f"{held}, {at_once:,} sequence(s) of {estimate.context:,} at once"


def _claimed(share: float, total_mb: int) -> int:
    """The bytes a share of a memory of total_mb takes (vLLM rounds up)."""
    return math.ceil(share * (total_mb << 20))


def _in_ram(estimate: Estimate, node: NodeCapacity) -> NodeFit:
    if node.memory_available_mb is None:
        return NodeFit(node.id, False, "has not reported its memory")
    free = node.memory_available_mb << 20
    if estimate.claim and node.memory_total_mb is not None:
        taken = _claimed(estimate.claim, node.memory_total_mb)
        if free < max(taken, estimate.total_bytes):
            return NodeFit(
                node.id,
                False,
                f"has {gigabytes(free)} of RAM free, and vLLM takes {estimate.claim:.0%} of its "
                f"{gigabytes(node.memory_total_mb << 20)} ({gigabytes(taken)})",
            )
    if free < estimate.total_bytes:
        return NodeFit(node.id, False, f"has {gigabytes(free)} of RAM free")
    return NodeFit(node.id, True, f"fits in RAM ({gigabytes(free)} free)")


def _usable(node: NodeCapacity, gpu_class: str) -> list[Card]:
    cards = [c for c in node.cards if c.usable and (not gpu_class or c.gpu_class == gpu_class)]
    return sorted(cards, key=lambda c: (-c.free_bytes, c.index))


def _on_cards(per_card: int, count: int, gpu_class: str, node: NodeCapacity, claim: float = 0.0) -> NodeFit:
    of_class = [c for c in node.cards if not gpu_class or c.gpu_class == gpu_class]
    what = f"{gpu_class} " if gpu_class else ""
    if not of_class:
        return NodeFit(node.id, False, f"has no {what}GPU")
    usable = _usable(node, gpu_class)
    if len(usable) < count:
        return NodeFit(
            node.id, False, f"has {len(usable)} free {what}GPU(s) of {len(of_class)}, {count} needed"
        )
    if claim:
        roomy = [c for c in usable if c.free_bytes >= max(per_card, _claimed(claim, c.memory_total_mb))]
        top = usable[0]
        on_best = " on its best card" if len(usable) > 1 else ""
        if len(roomy) < count and top.free_bytes >= per_card:
            return NodeFit(
                node.id,
                False,
                f"has {gigabytes(top.free_bytes)} free{on_best}, and vLLM takes {claim:.0%} "
                f"of its {gigabytes(top.memory_total_mb << 20)} "
                f"({gigabytes(_claimed(claim, top.memory_total_mb))})",
            )
        usable = roomy + [c for c in usable if c not in roomy]
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
            per_card = math.ceil(estimate.total_bytes / count)
            usable = [
                c
                for c in _usable(node, cls)
                if not estimate.claim or c.free_bytes >= _claimed(estimate.claim, c.memory_total_mb)
            ]
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
