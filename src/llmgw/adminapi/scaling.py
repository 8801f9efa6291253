"""An on-demand model's scale as the admin API, `ctl models`, `ctl explain` and the models page show it.

The leader's scaler (control/scaling.py) holds the decisions; this turns one into its view. A server
that does not place (`control.enabled: false`) has no scaler: its models show no scale.
"""

from __future__ import annotations

from aiohttp import web

from llmgw.adminapi import views
from llmgw.config import ModelConfig
from llmgw.control.scaling import Scaler, ScaleState
from llmgw.ondemand import on_demand, scale_of

SCALER_KEY = web.AppKey("llmgw.admin.scaler", Scaler)


def scale_view(request: web.Request, model: ModelConfig) -> views.Scale | None:
    """model's scale and the last decision, when it is on demand and this server has a scaler."""
    scaler = request.config_dict.get(SCALER_KEY)
    if scaler is None or not on_demand(model):
        return None
    return scale_of_view(scaler, model)


def scale_of_view(scaler: Scaler, model: ModelConfig) -> views.Scale:
    scale = scale_of(model)
    state = scaler.state(model.name)
    if state is None:
        why = (
            f"no decision yet: it starts at scale.min ({scale.min})"
            if scaler.deciding
            else "decided by the leader; this server does not decide (a standby, or not yet leading)"
        )
        state = ScaleState(model.name, scale.min, why)
    now = scaler.now()
    measured = state.cold_start
    return views.Scale(
        min=scale.min,
        max=scale.max,
        idle_s=scale.idle_s,
        target_in_flight=scale.target_in_flight,
        window_s=scale.window_s,
        priority=scale.priority,
        replicas=state.replicas,
        reason=state.reason,
        ready=state.ready,
        in_flight=state.in_flight,
        per_replica=round(state.per_replica(), 2),
        held=scaler.held(model.name),
        decided_s=round(now - state.decided_at, 1) if state.decided_at else None,
        last_request_s=round(now - state.last_request, 1) if state.last_request else None,
        eviction=state.eviction or None,
        cold_start=None
        if measured is None
        else views.ColdStart(
            total_s=round(measured.total_s, 2),
            place_s=round(measured.place_s, 2),
            weights_s=round(measured.weights_s, 2),
            engine_s=round(measured.engine_s, 2),
            node=measured.node,
        ),
    )
