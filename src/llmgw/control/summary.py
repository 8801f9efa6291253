"""Why a model serves nothing, in one sentence: the 503's, `ctl models`' and the models page's.

Placement judges every node (control/placement.py); this sums the verdicts up.
It once counted nodes by the first check that failed, so a model limited by
labels to one node whose engine failed to install read "6 nodes do not have
llamacpp installed, 2 nodes lack the labels pool=p-ldd": the one node that
could serve it was folded into a count, its install error never quoted, and
the labels looked like the problem. So the hard constraints (labels, GPU
class, memory, fabric) are applied first, and what blocks the nodes that pass
them leads, in the node's own words: "only n-ldd has pool=p-ldd, and llamacpp
b1 failed to install there: libllama-server-impl.so is not installed".
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence

from llmgw.config import ModelConfig, ProfileConfig
from llmgw.control.inventory import Node
from llmgw.control.records import ProvisionStatus
from llmgw.control.stream.provision import how_to_get
from llmgw.control.verdicts import (
    BACKOFF,
    CARDS,
    ENGINE,
    FABRIC,
    GIVEN_UP,
    GPU_CLASS,
    LABEL,
    MEMORY,
    STATE,
    Verdict,
)

# The groups a node's verdict falls in, in the order a summary says them: a failure of the model
# or of the engine's install first (what an operator acts on), then what will pass by itself.
_FAILED_INSTALL = "failed_install"
_INSTALLING = "installing"
_ORDER = (
    GIVEN_UP,
    BACKOFF,
    _FAILED_INSTALL,
    STATE,
    CARDS,
    MEMORY,
    FABRIC,
    _INSTALLING,
    ENGINE,
    GPU_CLASS,
    LABEL,
)
# Groups whose nodes are each named, with their own words, up to _NAMED: each may fail differently,
# and a count hides the words an operator needs. Past it, counted.
_EACH_NAMED = frozenset({GIVEN_UP, BACKOFF, _FAILED_INSTALL, _INSTALLING})
_NAMED = 3
# Before the kind of a verdict that is hard: such nodes can never take the profile.
_HARD = "hard:"

# How several nodes rejected for the same kind of reason are summed up.
_MANY: Mapping[str, str] = {
    STATE: "are not ready",
    ENGINE: "do not have {engine} installed",
    _FAILED_INSTALL: "failed to install {engine}",
    _INSTALLING: "are installing {engine}",
    GPU_CLASS: "have no {gpu} GPU",
    CARDS: "have too few free {gpu} GPUs",
    MEMORY: "have too little memory",
    FABRIC: "have no fabric with enough candidates",
    LABEL: "lack the labels {labels}",
    BACKOFF: "are backing off after failures of this model",
    GIVEN_UP: "are given up for this profile after the same failure in a row",
}


def summarize(
    model: ModelConfig,
    verdicts: Sequence[Verdict],
    nodes: Mapping[str, Node],
    now: float,
    needs: Mapping[str, str] | None = None,
) -> str:
    """The sentence for model, from placement's verdicts on every node for every profile of it.

    nodes is every node judged, by id: an install's state and words are read from it; now is the
    inventory's clock, which a failed install's next try counts down on. needs: profile -> its
    estimate in words ("about 4.3 GB (estimated from the model's headers)"), said where nodes
    counted together lack the memory, so that "3 nodes have too little memory" says for what.
    """
    parts: list[str] = []
    # The groups of the nodes that pass the hard constraints, over every profile.
    blocking: set[str] = set()
    for profile in model.profiles:
        groups = _group(profile, verdicts, nodes)
        only = _only(profile, groups, nodes, now)
        if only and len(model.profiles) == 1:
            return only
        blocking.update(k for k in groups if not k.startswith(_HARD))
        total = sum(1 for v in verdicts if v.profile == profile.name)
        said = only or _listed(profile, groups, nodes, total, now)
        need = (needs or {}).get(profile.name)
        short = any(k.removeprefix(_HARD) in (MEMORY, CARDS) for k in groups)
        if need and short and need not in said:
            said += f"; a replica needs {need}"
        parts.append(said if len(model.profiles) == 1 else f"profile {profile.name}: {said}")
    # A node installing the engine is where the model is going, said as such with its progress;
    # but only when nothing else blocks it: a failure elsewhere is what an operator must read first.
    if _INSTALLING in blocking and blocking <= {_INSTALLING, ENGINE}:
        return f"no node can run it until an engine is installed ({'; '.join(parts)})"
    return f"no node can run it ({'; '.join(parts)})"


def _group(
    profile: ProfileConfig, verdicts: Sequence[Verdict], nodes: Mapping[str, Node]
) -> dict[str, list[Verdict]]:
    """The rejected verdicts of profile, by group; hard ones apart from the rest under their own kind."""
    groups: dict[str, list[Verdict]] = defaultdict(list)
    for v in verdicts:
        if v.profile != profile.name or v.candidate:
            continue
        key = v.kind
        if v.hard:
            key = _HARD + v.kind
        elif v.kind == ENGINE:
            status = _install(nodes[v.node], profile.engine)
            if status is not None and status.state == "installing":
                key = _INSTALLING
            elif status is not None and status.state in ("failed", "unsupported"):
                key = _FAILED_INSTALL
        groups[key].append(v)
    return groups


def _eligible(groups: Mapping[str, list[Verdict]]) -> list[Verdict]:
    return [v for key in _ORDER for v in groups.get(key, [])]


def _hard(groups: Mapping[str, list[Verdict]]) -> list[Verdict]:
    return [v for key, group in groups.items() if key.startswith(_HARD) for v in group]


def _only(
    profile: ProfileConfig, groups: Mapping[str, list[Verdict]], nodes: Mapping[str, Node], now: float
) -> str:
    """ "only n-ldd has pool=p-ldd, and …": the hard constraints leave one node, and it is blocked.

    Empty otherwise: then every reason is listed, those of the nodes that pass the hard
    constraints first.
    """
    eligible, hard = _eligible(groups), _hard(groups)
    if len(eligible) != 1 or not hard:
        return ""
    [v] = eligible
    return f"only {v.node} has {_qualifies(profile)}, and {_there(profile, v, nodes[v.node], now)}"


def _qualifies(profile: ProfileConfig) -> str:
    """What the profile's hard constraints ask of a node: "pool=p-ldd and h100-80g GPUs"."""
    asks = [f"{k}={v}" for k, v in sorted(profile.labels.items())]
    if profile.gpu_class:
        asks.append(f"{profile.gpu_class} GPUs")
    elif profile.gpus_per_node > 0:
        asks.append("GPUs")
    if profile.min_memory_mb > 0:
        asks.append(f"{profile.min_memory_mb} MB of memory")
    if profile.nodes > 1:
        asks.append("a fabric")
    return " and ".join(asks) or "what it needs"


def _there(profile: ProfileConfig, verdict: Verdict, node: Node, now: float) -> str:
    """What blocks the one node that could serve, said of that node."""
    status = _install(node, profile.engine) if verdict.kind == ENGINE else None
    if status is None:
        return f"it {verdict.reason}"
    what = f"{status.engine} {status.version}" if status.version else status.engine
    detail = f": {status.detail}" if status.detail else ""
    if status.state == "installing":
        return f"{what} is installing there{detail}"
    if status.state == "unsupported":
        return f"{what} cannot be installed there{detail}"
    if status.state == "failed":
        return f"{what} failed to install there{detail}{_next_try(status, node, now)}"
    return f"it {verdict.reason}"


def _listed(
    profile: ProfileConfig,
    groups: Mapping[str, list[Verdict]],
    nodes: Mapping[str, Node],
    total: int,
    now: float,
) -> str:
    """Every group in order, the nodes that pass the hard constraints first: one node by its own
    words, several counted, those that failed each named."""
    parts: list[str] = []
    keys = [*_ORDER, *(_HARD + k for k in _ORDER)]
    for key in keys:
        group = groups.get(key, [])
        if not group:
            continue
        kind = key.removeprefix(_HARD)
        # Asked to install it nowhere: the one thing to say is what to set.
        how = how_to_get(profile.engine)
        plain = all(
            v.reason == f"does not have {profile.engine} installed" + (f": {how}" if how else "")
            for v in group
        )
        if kind in _EACH_NAMED:
            parts.extend(_named(profile, v, nodes[v.node], now) for v in group[:_NAMED])
            if len(group) > _NAMED:
                parts.append(f"{len(group) - _NAMED} more nodes {_many(profile, kind)}")
        elif kind == ENGINE and len(group) == total and plain:
            parts.append(f"no node has the {profile.engine} engine" + (f": {how}" if how else ""))
        elif len(group) == 1:
            parts.append(f"node {group[0].node} {group[0].reason}")
        else:
            parts.append(f"{len(group)} nodes {_many(profile, kind)}")
    return ", ".join(parts) or "every node is a candidate"


def _named(profile: ProfileConfig, verdict: Verdict, node: Node, now: float) -> str:
    """ "installing llamacpp b6500 on n3: downloading … (12 of 16 MB)", else the node and its reason."""
    status = _install(node, profile.engine) if verdict.kind == ENGINE else None
    if status is not None and status.state == "installing":
        what = f"{status.engine} {status.version}" if status.version else status.engine
        return f"installing {what} on {node.id}" + (f": {status.detail}" if status.detail else "")
    if status is not None and status.state == "failed":
        return f"node {verdict.node} {verdict.reason}{_next_try(status, node, now)}"
    return f"node {verdict.node} {verdict.reason}"


def _next_try(status: ProvisionStatus, node: Node, now: float) -> str:
    """ " (next try in 4 min)" after a failed install whose agent said when; empty when it did not."""
    if status.next_try_s is None:
        return ""
    left_s = status.next_try_s - max(0.0, now - node.provision_at)
    if left_s <= 0:
        return " (trying again now)"
    if left_s < 90:
        return f" (next try in {left_s:.0f} s)"
    return f" (next try in {left_s / 60:.0f} min)"


def _many(profile: ProfileConfig, kind: str) -> str:
    labels = ", ".join(f"{k}={v}" for k, v in sorted(profile.labels.items()))
    phrase = _MANY[kind].format(engine=profile.engine, gpu=profile.gpu_class or "", labels=labels)
    return phrase.replace("  ", " ")


def _install(node: Node, engine: str) -> ProvisionStatus | None:
    return next((p for p in node.provision if p.engine == engine and p.state != "ready"), None)
