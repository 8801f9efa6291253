"""Projections of the inventory and the catalog onto the admin API's views.

The API answers with these (adminapi/handlers.py) and the cluster pages render the very
same ones (web/cluster.py), so `llmgw ctl nodes` and the cluster page can never disagree
about a node.

Data other parts of llmgw have not reported yet (a node's disks, its installs,
its warnings) is None here and "—" on the page: an agent that was never asked
about its disk must not read as one with a full disk.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, cast
from urllib.parse import urlsplit

import llmgw
from llmgw.adminapi import views
from llmgw.config import ModelConfig
from llmgw.control.inventory import READY, UNREACHABLE, Inventory, Node, NodeNotConnected, Replica
from llmgw.control.nodelogs import DEFAULT_LINES, MAX_LINES, NoAnswer, NodeLog
from llmgw.control.placement import Backoff
from llmgw.engines.base import OPENAI_APIS
from llmgw.engines.registry import ENGINES
from llmgw.gateway.endpoints import ENDPOINT_ENGINE, Endpoints
from llmgw.gateway.translation import apis_served


def node_state(node: Node) -> views.NodeState:
    """One word for a node: what is wrong with it first, then what an administrator said."""
    if node.state == UNREACHABLE:
        return "unreachable"
    if not node.connected:
        return "disconnected"
    return _admin_state(node)


def _admin_state(node: Node) -> views.AdminState:
    # The inventory refuses any other (Inventory.set_admin_state).
    return cast(views.AdminState, node.admin_state)


def _reported(node: Node, name: str) -> Any:
    """A node attribute another part of llmgw may not have added yet: None until it has."""
    return getattr(node, name, None)


def _field(value: Any, name: str, default: Any = None) -> Any:
    return getattr(value, name, default)


def _gpus(node: Node, gpus_in_use: set[int]) -> views.GpuCounts | None:
    gpus = list(node.gpus or [])
    if not gpus:
        return None
    healthy = [g for g in gpus if _field(g, "healthy", True)]
    free = [g for g in healthy if _field(g, "index", -1) not in gpus_in_use]
    return views.GpuCounts(total=len(gpus), free=len(free), healthy=len(healthy))


def _memory(node: Node) -> views.Memory | None:
    memory = node.memory
    total = int(_field(memory, "total_mb", 0) or 0)
    if memory is None or total <= 0:
        return None
    return views.Memory(total_mb=total, available_mb=int(_field(memory, "available_mb", 0) or 0))


def _disk(node: Node) -> views.Disk | None:
    storage = _reported(node, "storage")
    if not storage:
        return None
    total = sum(int(_field(s, "total_bytes", 0) or 0) for s in storage)
    if total <= 0:
        return None
    free = sum(int(_field(s, "free_bytes", 0) or 0) for s in storage)
    return views.Disk(total_bytes=total, free_bytes=free)


def _names(items: Iterable[Any] | None, attribute: str) -> list[str] | None:
    if items is None:
        return None
    return sorted({str(_field(item, attribute, item)) for item in items if _field(item, attribute, item)})


def _unhealthy(node: Node) -> list[str]:
    problems = []
    for gpu in node.gpus or []:
        if not _field(gpu, "healthy", True):
            reason = _field(gpu, "unhealthy_reason", "") or "unhealthy"
            problems.append(
                f"GPU {_field(gpu, 'index', '?')} ({_field(gpu, 'name', '') or 'unknown'}): {reason}"
            )
    return problems


def _installs(node: Node) -> list[views.Install]:
    """Where each engine the node was asked to install stands, in the node's own words."""
    return [
        views.Install(
            engine=p.engine,
            version=p.version,
            variant=p.variant,
            # The agent's own words (agent/provision/installer.py); the document lists them.
            state=cast(views.InstallState, p.state),
            detail=p.detail,
        )
        for p in node.provision
    ]


def _host(node: Node) -> views.Host | None:
    host = node.host
    if host is None:
        return None
    return views.Host(
        os_id=host.os_id,
        os_version=host.os_version,
        os_codename=host.os_codename,
        family=host.family,
        arch=host.arch,
        cpu_flags=sorted(host.cpu_flags),
        nvidia_driver=host.nvidia_driver,
    )


def node_view(node: Node, inventory: Inventory, now: float | None = None) -> views.Node:
    """One node as the API and the cluster page show it."""
    now = inventory.now() if now is None else now
    replicas = [r for r in inventory.replicas() if r.node_id == node.id]
    in_use = {int(i) for r in replicas for i in (_field(r, "gpu_indices", None) or ())}
    installs = _installs(node)
    return views.Node(
        id=node.id,
        state=node_state(node),
        admin_state=_admin_state(node),
        connected=node.connected,
        reachable=node.state != UNREACHABLE,
        address=node.address,
        agent_version=node.agent_version,
        gpus=_gpus(node, in_use),
        memory=_memory(node),
        disk=_disk(node),
        # None: the agent has not said which engines it has, which is not the same as having none.
        engines=sorted(node.engine_versions) if node.engines_probed else None,
        classes=_names(node.gpus, "gpu_class") or [],
        fabrics=_names(_reported(node, "fabrics"), "name"),
        models=sorted({r.model for r in replicas}),
        replicas=len(replicas),
        last_seen_s=round(max(0.0, now - node.last_seen), 1) if node.last_seen else None,
        unhealthy=_unhealthy(node),
        # None: the agent has not said what it runs on (an agent older than host discovery).
        host=_host(node),
        provision=installs,
        installs_not_ready=[i for i in installs if i.state != READY],
        warnings=list(node.warnings),
        upgrade=views.NodeUpgrade(
            node.upgrade.version, node.upgrade.state, node.upgrade.detail, node.upgrade.from_version
        )
        if node.upgrade is not None
        else None,
    )


def nodes_view(inventory: Inventory) -> list[views.Node]:
    now = inventory.now()
    return [node_view(n, inventory, now) for n in sorted(inventory.nodes(), key=lambda n: n.id)]


def replicas_view(inventory: Inventory, model: str | None = None) -> list[views.Replica]:
    now = inventory.now()
    return [
        views.Replica(
            shard_id=r.shard_id,
            model=r.model,
            node=r.node_id,
            engine=r.engine,
            profile=r.profile,
            state=r.state,
            endpoint=r.endpoint,
            detail=r.detail,
            since_s=round(max(0.0, now - r.since), 1) if r.since else None,
            not_routed=_not_routed(r, inventory, now),
            agent_unreachable_s=_rounded(inventory.agent_unreachable_s(r)),
            retrying=inventory.failures.retrying(r.model, r.node_id) if r.state == "starting" else "",
        )
        for r in sorted(inventory.replicas(model), key=lambda r: (r.model, r.node_id, r.shard_id))
    ]


def _not_routed(replica: Replica, inventory: Inventory, now: float) -> str:
    """Why a ready replica is out of the routing table, or "": "ready" alone once read as serving
    after its node was lost, while every request for the model got a 503."""
    if replica.state != READY or replica.endpoint in inventory.ready_endpoints(replica.model):
        return ""
    node = inventory.node(replica.node_id)
    if node is None:
        return "node gone"
    if node.state == UNREACHABLE:
        return f"node unreachable for {max(0.0, now - node.last_seen):.0f} s"
    if not node.connected:
        return "node disconnected"
    if node.admin_state != READY:
        return f"node {node.admin_state}"
    return "the gateway could not connect to it"


def _rounded(seconds: float | None) -> float | None:
    return round(seconds, 1) if seconds is not None else None


def failures_view(inventory: Inventory, model: str | None = None) -> list[views.Failure]:
    """The failures the control plane keeps, of model or of all, newest first."""
    failures = inventory.failures
    return [
        views.Failure(
            shard_id=f.shard_id,
            model=f.model,
            node=f.node_id,
            engine=f.engine,
            profile=f.profile,
            reason=f.reason,
            last_output=list(f.last_output),
            ago_s=round(failures.age(f), 1),
        )
        for f in failures.recent(model)
    ]


def failed_replicas_view(inventory: Inventory, model: str | None = None) -> list[views.Replica]:
    """Replicas that failed lately and are gone, for `llmgw ctl replicas --all`, newest first."""
    live = {r.shard_id for r in inventory.replicas(model)}
    return [
        views.Replica(
            shard_id=f.shard_id,
            model=f.model,
            node=f.node,
            engine=f.engine,
            profile=f.profile,
            state="failed",
            endpoint="",
            detail=f.reason,
            since_s=f.ago_s,
        )
        for f in failures_view(inventory, model)
        if f.shard_id not in live
    ]


def endpoints_view(endpoints: Endpoints | None, model: str | None = None) -> list[views.Replica]:
    """A model's endpoints outside the fleet (gateway/endpoints.py) as `ctl replicas` lists replicas: its
    engine "endpoint", its node the endpoint's host, its state and why in words; never its key."""
    if endpoints is None:
        return []
    now = time.time()
    return [
        views.Replica(
            shard_id=e.id,
            model=e.model,
            node=urlsplit(e.url).netloc,
            engine=ENDPOINT_ENGINE,
            profile=e.upstream_model,
            state=e.state,
            endpoint=e.url,
            detail=e.detail,
            since_s=round(max(0.0, now - e.since), 1),
        )
        for e in endpoints.statuses(model)
    ]


def model_view(
    model: ModelConfig,
    inventory: Inventory,
    unpriced: str | None = None,
    endpoints: Endpoints | None = None,
    backoff: Mapping[tuple[str, str], Backoff] | None = None,
    scale: views.Scale | None = None,
) -> views.Model:
    """backoff: the reconciler's (`Reconciler.backoff`), None where this server places nothing."""
    if model.endpoints:
        listed = endpoints_view(endpoints, model.name)
        ready = sum(1 for r in listed if r.state == "ready")
        why = None if ready or endpoints is None else endpoints.why_no_ready(model.name)
        native, translated = apis_served(model.kind, [OPENAI_APIS])
        return views.Model(
            name=model.name,
            wanted=len(model.endpoints),
            ready=ready,
            engines=[ENDPOINT_ENGINE],
            replicas=listed,
            why_not_ready=why,
            unpriced=unpriced,
            native_apis=native,
            translated_apis=translated,
        )
    engines = list(dict.fromkeys(p.engine for p in model.profiles))
    native, translated = apis_served(model.kind, [ENGINES[e].native_apis for e in engines if e in ENGINES])
    return views.Model(
        name=model.name,
        wanted=scale.replicas if scale is not None else model.replicas,
        # Ready and on a reachable node: what the gateway would route to.
        ready=len(inventory.ready_endpoints(model.name)),
        engines=engines,
        replicas=replicas_view(inventory, model.name),
        why_not_ready=why_not_ready(inventory, model.name),
        unpriced=unpriced,
        failures=failures_view(inventory, model.name),
        backing_off=backing_off_view(model.name, backoff),
        native_apis=native,
        translated_apis=translated,
        scale=scale,
    )


def backing_off_view(model: str, backoff: Mapping[tuple[str, str], Backoff] | None) -> list[views.BackingOff]:
    """The nodes model waits on after failures there, soonest first; not those whose wait is over and
    where only some profiles are given up for good (`ctl explain` says those)."""
    waits = [
        views.BackingOff(node=node, failures=b.failures, next_try_s=round(b.remaining_s, 1))
        for (name, node), b in (backoff or {}).items()
        if name == model and b.remaining_s > 0
    ]
    return sorted(waits, key=lambda w: (w.next_try_s, w.node))


def why_not_ready(inventory: Inventory, model: str) -> str | None:
    """Why model serves nothing, in the words a client's 503 carries; None while it serves."""
    return None if inventory.ready_endpoints(model) else inventory.why_no_ready(model)


def models_view(inventory: Inventory, models: Sequence[ModelConfig]) -> list[views.Model]:
    """Every model of models, the live catalog's."""
    return [model_view(m, inventory) for m in models]


def status_view(
    inventory: Inventory, models: Sequence[ModelConfig], control_plane: views.ControlPlane | None = None
) -> views.Status:
    states = Counter(node_state(n) for n in inventory.nodes())
    replicas = inventory.replicas()
    return views.Status(
        version=llmgw.__version__,
        nodes=views.NodeCounts(
            total=sum(states.values()),
            ready=states["ready"],
            cordoned=states["cordoned"],
            draining=states["draining"],
            disconnected=states["disconnected"],
            unreachable=states["unreachable"],
        ),
        models=views.ModelCounts(
            total=len(models), serving=sum(1 for m in models if inventory.ready_endpoints(m.name))
        ),
        # Ready and routed: a replica on a lost node is out of the routing table, and counting it
        # read "2 of 2 ready" while every request got a 503.
        replicas=views.ReplicaCounts(
            total=len(replicas),
            ready=sum(
                1 for r in replicas if r.state == READY and r.endpoint in inventory.ready_endpoints(r.model)
            ),
        ),
        agent_unreachable=sum(1 for r in replicas if inventory.agent_unreachable_s(r) is not None),
        refused=[
            views.Refused(peer=r.peer, reason=r.reason, count=r.count, last_s=r.last_s)
            for r in inventory.refused.recent()
        ],
        control_plane=control_plane,
    )


def log_view(log: NodeLog) -> views.Logs:
    return views.Logs(node=log.node, source=log.source, lines=log.lines, sources=log.sources, error=log.error)


async def fetch_log(inventory: Inventory, node_id: str, source: str, lines: int) -> tuple[int, views.Logs]:
    """A node's log for the API and the page: the HTTP status and the view, its error in words."""
    source = source or "agent"
    if inventory.node(node_id) is None:
        return 404, log_view(NodeLog(node_id, source, [], [], f"no node {node_id} has registered"))
    try:
        log = await inventory.logs.fetch(node_id, source, lines)
    except NodeNotConnected as exc:
        return 502, log_view(NodeLog(node_id, source, [], ["agent"], str(exc)))
    except NoAnswer as exc:
        return 504, log_view(NodeLog(node_id, source, [], ["agent"], str(exc)))
    return (404 if log.error else 200), log_view(log)


def parse_lines(raw: str | None) -> int:
    """The `lines` query parameter, or ValueError saying what it may be."""
    if raw is None:
        return DEFAULT_LINES
    try:
        # ASCII only, as the document's integer is: int() reads "٥" and " 5 " too.
        if not raw.isascii():
            raise ValueError(raw)
        lines = int(raw)
    except ValueError:
        raise ValueError(f"lines is {raw!r}; expected a whole number from 1 to {MAX_LINES}") from None
    if not 1 <= lines <= MAX_LINES:
        raise ValueError(f"lines is {lines}; expected a whole number from 1 to {MAX_LINES}")
    return lines
