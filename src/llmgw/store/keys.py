"""API keys: created once in plaintext, stored only as a sha256 hash with a visible prefix."""

from __future__ import annotations

import hashlib
import json
import secrets
import string
from collections.abc import Sequence
from datetime import UTC, datetime

import attrs

from llmgw import strictjson
from llmgw.names import key_name_problem
from llmgw.store.base import Duplicate, Row, Store

KEY_PREFIX = "sk-llmgw-"
# Characters of the random part shown in listings: enough to tell keys apart,
# far too few to guess the rest (the key has 40 random characters, 238 bits).
_VISIBLE = 8
_RANDOM_LENGTH = 40
# Letters and digits only, so a double click selects the whole key.
_ALPHABET = string.ascii_letters + string.digits


@attrs.frozen
class KeyRecord:
    id: int
    name: str
    prefix: str
    key_hash: str
    created_at: datetime
    revoked_at: datetime | None
    # Every key belongs to a project (the default one unless told otherwise).
    project_id: int = 1
    expires_at: datetime | None = None
    # None: any model; a tuple: only these.
    models: tuple[str, ...] | None = None

    @property
    def revoked(self) -> bool:
        return self.revoked_at is not None


def hash_key(plaintext: str) -> str:
    """The form a key is stored and looked up in."""
    return hashlib.sha256(plaintext.encode()).hexdigest()


def visible_prefix(plaintext: str) -> str:
    return plaintext[: len(KEY_PREFIX) + _VISIBLE]


def _now() -> datetime:
    return datetime.now(UTC).replace(microsecond=0)


def _record(row: Row) -> KeyRecord:
    revoked_at = row["revoked_at"]
    expires_at = row["expires_at"]
    models = row["models"]
    return KeyRecord(
        id=row["id"],
        name=row["name"],
        prefix=row["prefix"],
        key_hash=row["key_hash"],
        created_at=datetime.fromisoformat(row["created_at"]),
        revoked_at=datetime.fromisoformat(revoked_at) if revoked_at else None,
        project_id=row["project_id"],
        expires_at=datetime.fromisoformat(expires_at) if expires_at else None,
        models=tuple(json.loads(models)) if models is not None else None,
    )


async def create_key(
    store: Store,
    name: str,
    *,
    project_id: int = 1,
    expires_at: datetime | None = None,
    models: Sequence[str] | None = None,
) -> tuple[str, KeyRecord]:
    """A new key: its plaintext, to show once, and the record that was stored.

    project_id: the project its requests count against; expires_at: when it
    stops working (UTC); models: the only models it may call (None: any).
    """
    problem = key_name_problem(name)
    if problem is not None:
        raise ValueError(problem)
    created_at = _now()
    # A prefix collision (1 in 62**8 per pair) would make revoking by prefix
    # ambiguous; the UNIQUE constraint refuses it and a fresh key is drawn.
    for _ in range(3):
        plaintext = KEY_PREFIX + "".join(secrets.choice(_ALPHABET) for _ in range(_RANDOM_LENGTH))
        try:
            async with store.transaction() as db:
                if await db.fetch_one("SELECT 1 FROM projects WHERE id = ?", (project_id,)) is None:
                    raise ValueError(f"there is no project {project_id} to put the key '{name}' in")
                key_id = await db.insert(
                    "INSERT INTO api_keys (name, prefix, key_hash, created_at,"
                    " project_id, expires_at, models) VALUES (?, ?, ?, ?, ?, ?, ?)",
                    (
                        name,
                        visible_prefix(plaintext),
                        hash_key(plaintext),
                        created_at.isoformat(),
                        project_id,
                        expires_at.astimezone(UTC).isoformat() if expires_at else None,
                        strictjson.dumps(list(models)) if models is not None else None,
                    ),
                )
        except Duplicate:
            continue
        record = KeyRecord(
            id=key_id,
            name=name,
            prefix=visible_prefix(plaintext),
            key_hash=hash_key(plaintext),
            created_at=created_at,
            revoked_at=None,
            project_id=project_id,
            expires_at=expires_at.astimezone(UTC) if expires_at else None,
            models=tuple(models) if models is not None else None,
        )
        return plaintext, record
    raise RuntimeError("three fresh keys in a row collided with existing ones; the random source is broken")


async def list_keys(store: Store) -> list[KeyRecord]:
    """Every key, revoked ones included, oldest first."""
    return [_record(row) for row in await store.fetch_all("SELECT * FROM api_keys ORDER BY id")]


async def find_key(store: Store, key_hash: str) -> KeyRecord | None:
    """The key with this sha256, revoked or not; None when the store has none."""
    row = await store.fetch_one("SELECT * FROM api_keys WHERE key_hash = ?", (key_hash,))
    return None if row is None else _record(row)


async def revoke_key(store: Store, prefix_or_key: str) -> KeyRecord | None:
    """Revoke the key with this visible prefix (or this whole key); None if there is no such key.

    Revoking a revoked key changes nothing and returns it as it was, with its
    first revocation time.
    """
    text = prefix_or_key.strip()
    if len(text) > len(KEY_PREFIX) + _VISIBLE:
        where, value = "key_hash = ?", hash_key(text)
    else:
        where, value = "prefix = ?", text
    async with store.transaction() as db:
        await db.execute(
            f"UPDATE api_keys SET revoked_at = ? WHERE {where} AND revoked_at IS NULL",
            (_now().isoformat(), value),
        )
        row = await db.fetch_one(f"SELECT * FROM api_keys WHERE {where}", (value,))
    return _record(row) if row is not None else None
