"""/v1/models lists what a key may call, and /v1/models/{id} answers the openai client's models.retrieve."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import TYPE_CHECKING

import openai
import pytest

from llmgw.gateway import access
from llmgw.gateway.errors import ApiError
from llmgw.store.keys import KeyRecord, create_key
from llmgw.store.scopes import Hierarchy

if TYPE_CHECKING:
    from conftest import Gateway, GatewayFactory

CATALOG = ("sim-chat", "meta-llama/Llama-3.1-8B", "other")


async def _key_for(gw: Gateway, *models: str) -> dict[str, str]:
    plaintext, _ = await create_key(gw.store, "narrow", models=models)
    await gw.keys.refresh(gw.store)
    return {"Authorization": f"Bearer {plaintext}"}


async def _listed(gw: Gateway, headers: dict[str, str]) -> list[str]:
    reply = await gw.client.get("/v1/models", headers=headers)
    assert reply.status == 200
    return [m["id"] for m in (await reply.json())["data"]]


class TestListing:
    async def test_a_key_for_some_models_sees_only_those(self, make_gateway: GatewayFactory) -> None:
        gw = await make_gateway(models=CATALOG)
        narrow = await _key_for(gw, "meta-llama/Llama-3.1-8B")
        assert await _listed(gw, narrow) == ["meta-llama/Llama-3.1-8B"]
        # The listing is cached per catalog change: one key's view must not become another's.
        assert await _listed(gw, gw.auth) == list(CATALOG)
        assert await _listed(gw, narrow) == ["meta-llama/Llama-3.1-8B"]

    async def test_without_auth_every_model_is_listed(self, make_gateway: GatewayFactory) -> None:
        gw = await make_gateway(models=CATALOG, auth=False)
        assert await _listed(gw, {}) == list(CATALOG)


class TestRetrieve:
    @pytest.mark.parametrize("path", ["meta-llama/Llama-3.1-8B", "meta-llama%2FLlama-3.1-8B"])
    async def test_an_org_model_is_answered_whether_its_slash_is_encoded_or_not(
        self, make_gateway: GatewayFactory, path: str
    ) -> None:
        gw = await make_gateway(models=CATALOG)
        reply = await gw.client.get(f"/v1/models/{path}", headers=gw.auth)
        assert reply.status == 200
        assert await reply.json() == {
            "id": "meta-llama/Llama-3.1-8B",
            "object": "model",
            "created": 0,
            "owned_by": "llmgw",
        }

    async def test_an_unknown_model_is_a_404_in_openai_s_shape(self, make_gateway: GatewayFactory) -> None:
        gw = await make_gateway(models=CATALOG)
        reply = await gw.client.get("/v1/models/nope", headers=gw.auth)
        assert reply.status == 404
        assert (await reply.json())["error"]["code"] == "model_not_found"

    async def test_a_model_the_key_may_not_call_is_a_403_naming_those_it_may(
        self, make_gateway: GatewayFactory
    ) -> None:
        gw = await make_gateway(models=CATALOG)
        narrow = await _key_for(gw, "sim-chat")
        reply = await gw.client.get("/v1/models/other", headers=narrow)
        assert reply.status == 403
        error = (await reply.json())["error"]
        assert error["code"] == "model_not_allowed" and "(it may use: sim-chat)" in error["message"]

    async def test_retrieving_needs_a_key(self, make_gateway: GatewayFactory) -> None:
        gw = await make_gateway(models=CATALOG)
        assert (await gw.client.get("/v1/models/sim-chat")).status == 401

    async def test_the_official_client_retrieves_an_org_model_and_lists_what_its_key_may_call(
        self, make_gateway: GatewayFactory
    ) -> None:
        gw = await make_gateway(models=CATALOG)
        narrow = (await _key_for(gw, "meta-llama/Llama-3.1-8B", "sim-chat"))["Authorization"].split()[1]
        base = str(gw.client.make_url("/v1"))

        def use_the_client() -> tuple[str, list[str], type[Exception] | None]:
            client = openai.OpenAI(base_url=base, api_key=narrow, max_retries=0)
            got = client.models.retrieve("meta-llama/Llama-3.1-8B").id
            listed = [m.id for m in client.models.list()]
            try:
                client.models.retrieve("nope")
            except openai.NotFoundError as exc:
                return got, listed, type(exc)
            return got, listed, None

        # In a thread: the client blocks, and the gateway answers on this loop.
        got, listed, refused = await asyncio.to_thread(use_the_client)
        assert got == "meta-llama/Llama-3.1-8B"
        assert listed == ["sim-chat", "meta-llama/Llama-3.1-8B"]
        assert refused is openai.NotFoundError


def _key(models: tuple[str, ...] | None) -> KeyRecord:
    return KeyRecord(
        id=1,
        name="ci",
        prefix="sk-llmgw-abc",
        key_hash="h",
        created_at=datetime(2026, 1, 1, tzinfo=UTC),
        revoked_at=None,
        models=models,
    )


class TestOneAnswer:
    def test_a_key_without_a_list_may_call_any_model_and_one_with_a_list_only_those(self) -> None:
        none = Hierarchy({}, {}, {})
        assert access.listed(["x"], None, none) == ["x"]
        assert access.may_call(_key(None), none, "x")
        assert access.may_call(_key(("x",)), none, "x")
        assert not access.may_call(_key(("x",)), none, "y")
        assert not access.may_call(_key(()), none, "x")

    def test_the_refusal_names_the_key_and_what_it_may_use(self) -> None:
        with pytest.raises(ApiError) as refused:
            access.check(_key(("x",)), Hierarchy({}, {}, {}), "y")
        assert refused.value.status == 403
        assert (
            refused.value.message
            == "the API key sk-llmgw-abc… (ci) may not use the model 'y' (it may use: x)"
        )
