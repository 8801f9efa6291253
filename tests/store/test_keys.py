"""API keys are shown once and stored only as a hash with a visible prefix."""

from __future__ import annotations

import asyncio
import hashlib
from pathlib import Path

import pytest

from llmgw.store import Store
from llmgw.store.keys import KEY_PREFIX, create_key, list_keys, revoke_key
from llmgw.store.sqlite import SqliteStore


class TestCreateKey:
    async def test_a_new_key_is_an_sk_llmgw_key_and_is_listed_by_its_prefix(self, store: Store) -> None:
        plaintext, record = await create_key(store, "ci")
        assert plaintext.startswith(KEY_PREFIX)
        assert len(plaintext) == len(KEY_PREFIX) + 40
        assert plaintext.startswith(record.prefix) and len(record.prefix) < len(plaintext) - 30
        assert record.key_hash == hashlib.sha256(plaintext.encode()).hexdigest()
        assert await list_keys(store) == [record]

    async def test_the_plaintext_key_is_never_written_to_disk(self, store: Store, tmp_path: Path) -> None:
        plaintext, _ = await create_key(store, "ci")
        secret = plaintext[len(KEY_PREFIX) + 8 :]
        rows = [tuple(row) for row in await store.fetch_all("SELECT * FROM api_keys")]
        assert not any(secret in str(value) for row in rows for value in row)
        if not isinstance(store, SqliteStore):
            return
        # The database file and its write-ahead log, where the insert lands first.
        files = await asyncio.to_thread(lambda: {p.name: p.read_bytes() for p in tmp_path.iterdir()})
        assert "llmgw.db-wal" in files
        for name, content in files.items():
            assert secret.encode() not in content, name

    async def test_two_keys_never_share_a_prefix_or_a_plaintext(self, store: Store) -> None:
        created = [await create_key(store, f"k{i}") for i in range(20)]
        assert len({plaintext for plaintext, _ in created}) == 20
        assert len({record.prefix for _, record in created}) == 20

    async def test_a_key_without_a_name_is_refused(self, store: Store) -> None:
        with pytest.raises(ValueError, match="needs a name"):
            await create_key(store, "  ")


class TestRevokeKey:
    async def test_a_key_is_revoked_by_its_visible_prefix(self, store: Store) -> None:
        _, record = await create_key(store, "ci")
        revoked = await revoke_key(store, record.prefix)
        assert revoked is not None and revoked.revoked and revoked.id == record.id
        assert [r.revoked for r in await list_keys(store)] == [True]

    async def test_a_key_is_revoked_by_its_whole_plaintext(self, store: Store) -> None:
        plaintext, record = await create_key(store, "ci")
        revoked = await revoke_key(store, plaintext)
        assert revoked is not None and revoked.id == record.id and revoked.revoked

    async def test_revoking_again_keeps_the_first_revocation_time(self, store: Store) -> None:
        _, record = await create_key(store, "ci")
        first = await revoke_key(store, record.prefix)
        again = await revoke_key(store, record.prefix)
        assert first is not None and again is not None
        assert again.revoked_at == first.revoked_at

    async def test_revoking_an_unknown_prefix_finds_nothing_and_changes_nothing(self, store: Store) -> None:
        _, record = await create_key(store, "ci")
        assert await revoke_key(store, KEY_PREFIX + "zzzzzzzz") is None
        assert await list_keys(store) == [record]
