"""API key checks from an in-memory cache: one sha256 and one dict lookup per request, no database.

A key the cache does not have is looked up in the store before it is refused, so that a key created
anywhere (`llmgw keys create`, another server on the same PostgreSQL) is known to every gateway as
soon as its creator is told it: the cache itself is reloaded only every half second. One lookup at
a time, and each unknown key at most once per reload: a flood of made-up keys costs the store one
query at a time, never one per request.
"""

from __future__ import annotations

import hashlib
from collections.abc import Awaitable, Callable, Iterable
from datetime import UTC, datetime

from aiohttp import web

from llmgw.errors import StoreError
from llmgw.gateway.errors import ApiError
from llmgw.gateway.pipeline import Call, Handler
from llmgw.store import Store
from llmgw.store.keys import KEY_PREFIX, KeyRecord, list_keys

# Where Anthropic's clients put the key.
API_KEY_HEADER = "x-api-key"
# A key's sha256 hex digest → its record in the store, or None.
Lookup = Callable[[str], Awaitable[KeyRecord | None]]


class KeyCache:
    """Every key the store holds, by hash; revoked keys too, so a client can be told why."""

    def __init__(self, records: Iterable[KeyRecord] = (), *, lookup: Lookup | None = None) -> None:
        self._by_hash: dict[str, KeyRecord] = {}
        # None: only what the cache holds is known (a gateway without a store of its own).
        self._lookup = lookup
        # Hashes the store did not have at their lookup: not asked again until the next reload.
        self._missed: set[str] = set()
        self._looking = False
        self.replace(records)

    def replace(self, records: Iterable[KeyRecord]) -> None:
        """Swap in a whole new set at once: a request never sees half of a refresh."""
        self._by_hash = {record.key_hash: record for record in records}
        self._missed = set()

    async def look_up(self, authorization: str | None) -> bool:
        """Whether the store has the key of an Authorization header the cache did not; cached if so."""
        _, _, token = (authorization or "").strip().partition(" ")
        token = token.strip()
        if self._lookup is None or self._looking or not token.startswith(KEY_PREFIX):
            return False
        digest = hashlib.sha256(token.encode()).hexdigest()
        # Known and refused (revoked, expired): nothing the store could add.
        if digest in self._missed or digest in self._by_hash:
            return False
        self._looking = True
        try:
            record = await self._lookup(digest)
        except StoreError:
            # The store away: the cache is all there is, as it is for every other key.
            return False
        finally:
            self._looking = False
        if record is None:
            self._missed.add(digest)
            return False
        self._by_hash[digest] = record
        return True

    async def refresh(self, store: Store) -> None:
        """Reload from the store; the caller decides how often (revocation must bite within a second)."""
        self.replace(await list_keys(store))

    def lookup(self, plaintext: str) -> KeyRecord | None:
        return self._by_hash.get(hashlib.sha256(plaintext.encode()).hexdigest())

    def authenticate(self, authorization: str | None) -> KeyRecord:
        """The live key an Authorization header carries, or a 401 saying what is wrong with it."""
        if not authorization:
            raise _unauthorized(
                "this gateway needs an API key: send 'Authorization: Bearer <key>' or 'x-api-key: <key>' "
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
        headers = call.request.headers
        authorization = headers.get("Authorization")
        if authorization is None and (api_key := headers.get(API_KEY_HEADER)):
            # Anthropic's clients send the key as x-api-key (Claude Code with ANTHROPIC_API_KEY); with
            # ANTHROPIC_AUTH_TOKEN, as a Bearer token like OpenAI's.
            authorization = f"Bearer {api_key.strip()}"
        try:
            call.key = self._keys.authenticate(authorization)
        except ApiError:
            # Made since the cache's last reload, perhaps: the store is asked before the 401.
            if not await self._keys.look_up(authorization):
                raise
            call.key = self._keys.authenticate(authorization)
        return await rest(call)
