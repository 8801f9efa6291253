"""Keys are checked against the in-memory cache; a revoked key stops working once the cache is refreshed."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

import pytest

from llmgw.gateway.auth import KeyCache
from llmgw.gateway.errors import ApiError
from llmgw.store import Store
from llmgw.store.keys import KeyRecord, create_key, find_key, revoke_key

from ..waiting import eventually

if TYPE_CHECKING:
    from conftest import FakeEngine, GatewayFactory

MODEL = "sim-chat"
CHAT = "/v1/chat/completions"


class TestAKeyTheCacheDoesNotHaveYet:
    """Looked up in the store before it is refused: a key made anywhere works at once."""

    async def test_a_key_made_after_the_last_reload_is_found_in_the_store_and_kept(
        self, store: Store
    ) -> None:
        asked: list[str] = []

        async def lookup(digest: str) -> KeyRecord | None:
            asked.append(digest)
            return await find_key(store, digest)

        keys = KeyCache(lookup=lookup)
        await keys.refresh(store)
        plaintext, record = await create_key(store, "made-elsewhere")
        with pytest.raises(ApiError):
            keys.authenticate(f"Bearer {plaintext}")
        assert await keys.look_up(f"Bearer {plaintext}")
        assert keys.authenticate(f"Bearer {plaintext}") == record
        assert asked == [record.key_hash]

    async def test_an_unknown_key_costs_one_lookup_until_the_next_reload(self, store: Store) -> None:
        asked: list[str] = []

        async def lookup(digest: str) -> KeyRecord | None:
            asked.append(digest)
            return None

        keys = KeyCache(lookup=lookup)
        wrong = "Bearer sk-llmgw-" + "x" * 40
        assert not await keys.look_up(wrong)
        assert not await keys.look_up(wrong)
        assert len(asked) == 1
        await keys.refresh(store)
        assert not await keys.look_up(wrong)
        assert len(asked) == 2
        # Not even shaped like a key: the store is not asked.
        assert not await keys.look_up("Bearer something-else")
        assert len(asked) == 2

    async def test_only_one_lookup_runs_at_a_time(self) -> None:
        release = asyncio.Event()
        asked: list[str] = []

        async def lookup(digest: str) -> KeyRecord | None:
            asked.append(digest)
            await release.wait()
            return None

        keys = KeyCache(lookup=lookup)
        first = asyncio.create_task(keys.look_up("Bearer sk-llmgw-" + "a" * 40))
        await eventually(lambda: asked)
        assert not await keys.look_up("Bearer sk-llmgw-" + "b" * 40)
        release.set()
        assert not await first
        assert len(asked) == 1

    async def test_a_revoked_key_the_cache_holds_is_not_looked_up_again(self, store: Store) -> None:
        plaintext, record = await create_key(store, "ci")
        await revoke_key(store, record.prefix)
        asked: list[str] = []

        async def lookup(digest: str) -> KeyRecord | None:
            asked.append(digest)
            return await find_key(store, digest)

        keys = KeyCache(lookup=lookup)
        await keys.refresh(store)
        assert not await keys.look_up(f"Bearer {plaintext}")
        assert asked == []


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
