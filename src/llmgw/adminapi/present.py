"""How the admin API's views read to a person: the cells of the cluster page and of `llmgw ctl`.

One presenter for both, so that a node's free RAM or its notes cannot read one
way on the page and another in a shell. What a node has not reported reads
"—", never a zero: a node that was never asked about its disk must not look
full.
"""

from __future__ import annotations

from collections import Counter

import attrs

from llmgw.adminapi import views
from llmgw.gateway.endpoints import ENDPOINT_ENGINE

DASH = "—"
# The line counts a node's log page offers, and how often it reloads itself when following.
LOG_PAGE_LINES = (100, 300, 1000, 2000)
LOG_PAGE_FOLLOW_S = 5


@attrs.frozen
class NodeRow:
    """A node's view as text, one attribute per column."""

    id: str
    state: str
    # The agent's llmgw version; "unknown" for an agent from before versions were sent.
    version: str
    address: str
    # "ubuntu 24.04 (noble) amd64, NVIDIA 570.86.15", or empty when the node did not say.
    os: str
    gpus: str
    ram: str
    disk: str
    engines: str
    classes: str
    fabrics: str
    models: str
    replicas: int
    last_seen: str
    # (kind, text): kind is "bad" for what keeps the node from work, "note" for what will pass.
    notes: list[tuple[str, str]]


def _gib(mb: int) -> str:
    return f"{mb / 1024:.1f}"


def _bytes(n: int) -> str:
    for unit, size in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"


def _ago(seconds: float | None) -> str:
    if seconds is None:
        return DASH
    if seconds < 90:
        return f"{seconds:.0f} s ago"
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f} min ago"
    return f"{seconds / 3600:.1f} h ago"


def _join(items: list[str] | None) -> str:
    return ", ".join(items) if items else DASH


def _os(host: views.Host | None) -> str:
    """What an operator checks a build against."""
    if host is None or not host.os_id:
        return ""
    text = " ".join(v for v in (host.os_id, host.os_version) if v)
    if host.os_codename:
        text += f" ({host.os_codename})"
    if host.arch:
        text += f" {host.arch}"
    if host.nvidia_driver:
        text += f", NVIDIA {host.nvidia_driver}"
    return text


def _notes(view: views.Node) -> list[tuple[str, str]]:
    # In the order a person works through them: what the node cannot run yet, what makes it slow,
    # then the hardware placement leaves out.
    notes: list[tuple[str, str]] = []
    upgrade = upgrade_note(view.upgrade)
    if upgrade is not None:
        notes.append(upgrade)
    for install in view.installs_not_ready:
        variant = f" ({install.variant})" if install.variant else ""
        kind = "bad" if install.state in ("failed", "unsupported") else "note"
        notes.append((kind, f"{install.engine} {install.version}{variant} {install.state}: {install.detail}"))
    notes.extend(("bad", warning) for warning in view.warnings)
    notes.extend(("bad", problem) for problem in view.unhealthy)
    return notes


def upgrade_note(upgrade: views.NodeUpgrade | None) -> tuple[str, str] | None:
    """A node's last upgrade, while it is under way or when it did not take; None once it took."""
    if upgrade is None or upgrade.state == "upgraded":
        return None
    if upgrade.state == "rolled back":
        return "bad", f"rolled back from {upgrade.version}: {upgrade.detail}"
    if upgrade.state == "refused":
        return "bad", f"refused the upgrade to {upgrade.version}: {upgrade.detail}"
    return "note", f"upgrading to {upgrade.version}: {upgrade.state} ({upgrade.detail})"


def node_row(view: views.Node) -> NodeRow:
    gpus, memory, disk = view.gpus, view.memory, view.disk
    return NodeRow(
        id=view.id,
        state=view.state,
        version=view.agent_version or "unknown",
        address=view.address,
        os=_os(view.host),
        gpus=f"{gpus.free}/{gpus.total}" if gpus else DASH,
        ram=f"{_gib(memory.available_mb)}/{_gib(memory.total_mb)} GiB" if memory else DASH,
        disk=f"{_bytes(disk.free_bytes)}/{_bytes(disk.total_bytes)}" if disk else DASH,
        engines=", ".join(view.engines) if view.engines else "none yet",
        classes=_join(view.classes),
        fabrics=_join(view.fabrics),
        models=_join(view.models),
        replicas=view.replicas,
        last_seen=_ago(view.last_seen_s),
        notes=_notes(view),
    )


def refused_line(refused: views.Refused) -> str:
    """ "3 refused connections from 198.18.0.7 in the last hour: certificate not signed by ..."."""
    connections = "connection" if refused.count == 1 else "connections"
    return f"{refused.count} refused {connections} from {refused.peer} in the last hour: {refused.reason}"


def control_plane_line(plane: views.ControlPlane) -> str:
    """ "cp2, standby; the leader is cp1 at 198.18.0.1:7443"."""
    if plane.role == "leader":
        return f"{plane.name}, the leader"
    if not plane.leader:
        return f"{plane.name}, standby; no control plane holds the leadership right now"
    return f"{plane.name}, standby; the leader is {plane.leader} at {plane.leader_address}"


def failure_line(failure: views.Failure) -> str:
    """ "n1, 2 min ago: llamacpp exited with code 1: error: failed to load model"."""
    return f"{failure.node}, {ago(failure.ago_s)}: {failure.reason or 'no reason given'}"


def ago(seconds: float | None) -> str:
    """ "12 s ago", "3 min ago"; "—" for unknown."""
    return _ago(seconds)


def replica_state(replica: views.Replica) -> str:
    """ "ready"; "ready (node unreachable for 20 s; not routed)" for one the gateway passes by; "ready; its
    node's agent unreachable for 40 s" for one it still serves without its agent; "starting (try 2; the
    last did not answer /health within 30 s)" after a failure."""
    if replica.engine == ENDPOINT_ENGINE:
        # A server outside the fleet: its state is its last check's, and why it fails is the whole story.
        said = f": {replica.detail}" if replica.detail and replica.state != "ready" else ""
        return f"endpoint {replica.state}{said}"
    if replica.not_routed:
        return f"{replica.state} ({replica.not_routed}; not routed)"
    if replica.retrying:
        return f"{replica.state} ({replica.retrying})"
    if replica.agent_unreachable_s is None:
        return replica.state
    return f"{replica.state}; its node's agent unreachable for {replica.agent_unreachable_s:.0f} s"


def model_note(model: views.Model) -> str:
    """Why the model serves nothing; else what of its serving its nodes' agents cannot vouch for."""
    if model.why_not_ready:
        return model.why_not_ready
    unattended = [r for r in model.replicas if r.agent_unreachable_s is not None]
    return "; ".join(f"{r.shard_id} on {r.node} {replica_state(r)}" for r in unattended)


def unattended_note(status: views.Status) -> str:
    """ " (1 whose node's agent is unreachable)" after the ready count; empty when there is none."""
    if not status.agent_unreachable:
        return ""
    return f" ({status.agent_unreachable} whose node's agent is unreachable)"


def hidden_models(models: list[views.Model], listed: set[str], everything: bool) -> str:
    """Beneath `ctl replicas`: how many of models have no row among listed (the models of its rows), and why.

    A model that keeps failing has no replica between its tries, and vanished from the table with
    no hint that it exists: "4 models have no replica now (1 failing, 1 backing off, 1 not placed,
    1 set to 0 replicas): see `llmgw ctl replicas --all` or `llmgw ctl models`". Backing off: it
    waits out the backoff after failures on every node that would take it; failing: it failed
    lately and waits on no node. Empty when every model has a row.
    everything: the table has the failed replicas too (`--all`), so not pointing there again.
    """
    hidden = [m for m in models if m.name not in listed]
    if not hidden:
        return ""
    why = Counter(_why_no_replica(m) for m in hidden)
    said = ", ".join(f"{why[reason]} {reason}" for reason in _WHY_NO_REPLICA if why[reason])
    if len(hidden) == 1:
        model = hidden[0]
        said = f"{model.name}: {_why_no_replica(model)}"
        if model.backing_off and model.wanted:
            said += f", next try in {model.backing_off[0].next_try_s:.0f} s"
    many = f"{len(hidden)} models have" if len(hidden) > 1 else "1 model has"
    see = "`llmgw ctl models`" if everything else "`llmgw ctl replicas --all` or `llmgw ctl models`"
    return f"{many} no replica now ({said}): see {see}"


# In the order they are said: what is wrong first, then what was asked for.
_WHY_NO_REPLICA = ("failing", "backing off", "not placed", "set to 0 replicas")


def _why_no_replica(model: views.Model) -> str:
    if model.wanted == 0:
        return "set to 0 replicas"
    if model.backing_off:
        return "backing off"
    return "failing" if model.failures else "not placed"
