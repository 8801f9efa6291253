"""API key checks from an in-memory cache: one sha256 and one dict lookup per request, no database."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from datetime import UTC, datetime

from aiohttp import web

from llmgw.gateway.errors import ApiError
from llmgw.gateway.pipeline import Call, Handler
from llmgw.store import Store
from llmgw.store.keys import KeyRecord, list_keys


class KeyCache:
    """Every key the store holds, by hash; revoked keys too, so a client can be told why."""

    def __init__(self, records: Iterable[KeyRecord] = ()) -> None:
        self._by_hash: dict[str, KeyRecord] = {}
        self.replace(records)

    def replace(self, records: Iterable[KeyRecord]) -> None:
        """Swap in a whole new set at once: a request never sees half of a refresh."""
        self._by_hash = {record.key_hash: record for record in records}

    async def refresh(self, store: Store) -> None:
        """Reload from the store; the caller decides how often (revocation must bite within a second)."""
        self.replace(await list_keys(store))

    def lookup(self, plaintext: str) -> KeyRecord | None:
        return self._by_hash.get(hashlib.sha256(plaintext.encode()).hexdigest())

    def authenticate(self, authorization: str | None) -> KeyRecord:
        """The live key an Authorization header carries, or a 401 saying what is wrong with it."""
        if not authorization:
            raise _unauthorized(
                "this gateway needs an API key: send 'Authorization: Bearer <key>' "
                "(an administrator creates one with `llmgw keys create NAME`)"
            )
        scheme, _, token = authorization.strip().partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            raise _unauthorized("the Authorization header must read 'Bearer <key>'")
        record = self.lookup(token)
        if record is None:
            raise _unauthorized(f"the API key {_shown(token)} is not known to this gateway")
        if record.revoked_at is not None:
            raise _unauthorized(
                f"the API key {record.prefix}… ({record.name}) was revoked on "
                f"{record.revoked_at:%Y-%m-%d at %H:%M} UTC"
            )
        if record.expires_at is not None and record.expires_at <= datetime.now(UTC):
            raise _unauthorized(
                f"the API key {record.prefix}… ({record.name}) expired on "
                f"{record.expires_at:%Y-%m-%d at %H:%M} UTC"
            )
        return record


def _shown(token: str) -> str:
    """Enough of a wrong key for its owner to recognise it, never the whole of it."""
    return f"{token[:12]}…" if len(token) > 20 else "given"


def _unauthorized(message: str) -> ApiError:
    return ApiError(401, message, code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"})


class Authenticate:
    """The pipeline stage: sets call.key, or refuses with 401."""

    def __init__(self, keys: KeyCache) -> None:
        self._keys = keys

    async def __call__(self, call: Call, rest: Handler) -> web.StreamResponse:
        call.key = self._keys.authenticate(call.request.headers.get("Authorization"))
        return await rest(call)
