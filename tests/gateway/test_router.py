"""The router sends a request to the ready replica with the fewest requests in flight."""

from __future__ import annotations

from collections.abc import Sequence

import attrs
import pytest

from llmgw.control.routes import EngineRoute
from llmgw.gateway.errors import ApiError
from llmgw.gateway.router import Router

MODEL = "sim-chat"
WHY = "sim-chat has no ready replica: no node can run it (no node has the sim engine)"
A, B, C = "http://127.0.0.1:1", "http://127.0.0.1:2", "http://127.0.0.1:3"


@attrs.define
class FakeReplicas:
    endpoints: dict[str, list[str]]

    def ready_endpoints(self, model: str) -> Sequence[str]:
        return self.endpoints.get(model, [])

    def why_no_ready(self, model: str) -> str:
        return WHY

    def route(self, endpoint: str) -> EngineRoute | None:
        return None


def _router(*endpoints: str) -> Router:
    return Router([MODEL], FakeReplicas(endpoints={MODEL: list(endpoints)}))


class TestRouter:
    def test_the_replica_with_fewest_requests_in_flight_is_chosen(self) -> None:
        router = _router(A, B, C)
        first, second, third = router.choose(MODEL), router.choose(MODEL), router.choose(MODEL)
        assert {first, second, third} == {A, B, C}
        router.release(second)
        assert router.choose(MODEL) == second

    def test_replicas_tied_at_zero_take_turns(self) -> None:
        router = _router(A, B)
        chosen = []
        for _ in range(4):
            endpoint = router.choose(MODEL)
            chosen.append(endpoint)
            router.release(endpoint)
        assert chosen.count(A) == chosen.count(B) == 2

    def test_a_finished_request_leaves_no_trace_in_the_table(self) -> None:
        router = _router(A)
        router.release(router.choose(MODEL))
        assert router.in_flight == {}

    def test_a_model_outside_the_catalog_is_404(self) -> None:
        with pytest.raises(ApiError) as caught:
            _router(A).choose("nope")
        assert caught.value.status == 404 and caught.value.code == "model_not_found"

    def test_a_model_with_no_ready_replica_is_503_with_the_inventorys_reason(self) -> None:
        with pytest.raises(ApiError) as caught:
            _router().choose(MODEL)
        assert caught.value.status == 503
        assert caught.value.message == WHY
