"""Keys are checked against the in-memory cache; a revoked key stops working once the cache is refreshed."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from llmgw.gateway.auth import KeyCache
from llmgw.gateway.errors import ApiError
from llmgw.store import Store
from llmgw.store.keys import create_key, revoke_key

if TYPE_CHECKING:
    from conftest import FakeEngine, GatewayFactory

MODEL = "sim-chat"
CHAT = "/v1/chat/completions"


class TestKeyCache:
    async def test_a_live_key_is_accepted_with_or_without_a_capital_bearer(self, store: Store) -> None:
        plaintext, record = await create_key(store, "ci")
        keys = KeyCache()
        await keys.refresh(store)
        assert keys.authenticate(f"Bearer {plaintext}") == record
        assert keys.authenticate(f"bearer  {plaintext} ") == record

    @pytest.mark.parametrize(
        ("header", "says"),
        [
            (None, "needs an API key"),
            ("", "needs an API key"),
            ("Basic dXNlcjpwYXNz", "must read 'Bearer <key>'"),
            ("Bearer", "must read 'Bearer <key>'"),
            ("Bearer sk-llmgw-nottherightkeyatallnottherightkey", "is not known"),
        ],
    )
    def test_a_missing_or_wrong_key_is_refused_saying_what_is_wrong(
        self, header: str | None, says: str
    ) -> None:
        with pytest.raises(ApiError) as caught:
            KeyCache().authenticate(header)
        assert caught.value.status == 401 and says in caught.value.message

    def test_a_wrong_key_is_never_echoed_whole(self) -> None:
        wrong = "sk-llmgw-" + "s3cr3t" * 6
        with pytest.raises(ApiError) as caught:
            KeyCache().authenticate(f"Bearer {wrong}")
        assert wrong not in caught.value.message

    async def test_a_revoked_key_is_refused_saying_when_it_was_revoked(self, store: Store) -> None:
        plaintext, record = await create_key(store, "ci")
        await revoke_key(store, record.prefix)
        keys = KeyCache()
        await keys.refresh(store)
        with pytest.raises(ApiError, match=r"\(ci\) was revoked on \d{4}-\d\d-\d\d"):
            keys.authenticate(f"Bearer {plaintext}")


class TestGatewayAuth:
    async def test_a_request_without_a_key_is_401_in_openais_shape(
        self, make_gateway: GatewayFactory, engine: tuple[FakeEngine, str]
    ) -> None:
        gw = await make_gateway()
        gw.replicas.endpoints[MODEL] = [engine[1]]
        resp = await gw.client.post(CHAT, json={"model": MODEL})
        assert resp.status == 401
        assert resp.headers["WWW-Authenticate"] == "Bearer"
        error = (await resp.json())["error"]
        assert error["code"] == "invalid_api_key" and error["type"] == "invalid_request_error"
        assert engine[0].received == []

    async def test_a_wrong_key_is_401(self, make_gateway: GatewayFactory) -> None:
        gw = await make_gateway()
        resp = await gw.client.post(
            CHAT, json={"model": MODEL}, headers={"Authorization": "Bearer sk-llmgw-wrong"}
        )
        assert resp.status == 401

    async def test_a_revoked_key_stops_working_when_the_cache_is_refreshed(
        self, make_gateway: GatewayFactory, engine: tuple[FakeEngine, str]
    ) -> None:
        gw = await make_gateway()
        gw.replicas.endpoints[MODEL] = [engine[1]]
        assert (await gw.client.post(CHAT, json={"model": MODEL}, headers=gw.auth)).status == 200
        assert await revoke_key(gw.store, gw.key) is not None
        # Until the refresh the gateway answers from its cache: no database read per request.
        assert (await gw.client.post(CHAT, json={"model": MODEL}, headers=gw.auth)).status == 200
        await gw.keys.refresh(gw.store)
        resp = await gw.client.post(CHAT, json={"model": MODEL}, headers=gw.auth)
        assert resp.status == 401
        assert "was revoked" in (await resp.json())["error"]["message"]

    async def test_with_auth_disabled_no_key_is_needed(
        self, make_gateway: GatewayFactory, engine: tuple[FakeEngine, str]
    ) -> None:
        gw = await make_gateway(auth=False)
        gw.replicas.endpoints[MODEL] = [engine[1]]
        assert (await gw.client.post(CHAT, json={"model": MODEL})).status == 200
        assert (await gw.client.get("/v1/models")).status == 200
