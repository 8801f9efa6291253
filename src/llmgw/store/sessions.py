"""Sign-in sessions for the pages: a random token in a cookie, only its sha256 in the store.

Kept in the store rather than in memory so that a restart does not sign
everyone out, and so that `llmgw users disable` (another process) ends a
person's sessions at once. Only the pages read them; /v1/* never does.
"""

from __future__ import annotations

import hashlib
import secrets
from datetime import UTC, datetime, timedelta

import attrs

from llmgw.store.base import Store

# 256 bits: a session token is as good as a password while it lasts.
_TOKEN_BYTES = 32


@attrs.frozen
class Session:
    user_id: int
    # Per-session, so that a form copied from one person's page is refused in another's.
    csrf: str
    expires_at: datetime


def _hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def _now() -> datetime:
    return datetime.now(UTC).replace(microsecond=0)


async def create_session(store: Store, user_id: int, ttl_s: float) -> tuple[str, Session]:
    """A new session for user_id: the token for the cookie (never stored) and the session."""
    token = secrets.token_urlsafe(_TOKEN_BYTES)
    now = _now()
    session = Session(
        user_id=user_id, csrf=secrets.token_urlsafe(_TOKEN_BYTES), expires_at=now + timedelta(seconds=ttl_s)
    )
    async with store.transaction() as db:
        # Expired sessions are swept here, on the rare write, not on every page.
        await db.execute("DELETE FROM sessions WHERE expires_at < ?", (now.isoformat(),))
        await db.execute(
            "INSERT INTO sessions (token_hash, user_id, csrf, created_at, expires_at) VALUES (?, ?, ?, ?, ?)",
            (_hash(token), user_id, session.csrf, now.isoformat(), session.expires_at.isoformat()),
        )
    return token, session


async def lookup_session(store: Store, token: str) -> Session | None:
    """The live session a cookie's token names; None when unknown or expired."""
    row = await store.fetch_one(
        "SELECT user_id, csrf, expires_at FROM sessions WHERE token_hash = ?", (_hash(token),)
    )
    if row is None:
        return None
    expires_at = datetime.fromisoformat(row["expires_at"])
    if expires_at <= datetime.now(UTC):
        return None
    return Session(user_id=row["user_id"], csrf=row["csrf"], expires_at=expires_at)


async def end_session(store: Store, token: str) -> None:
    async with store.transaction() as db:
        await db.execute("DELETE FROM sessions WHERE token_hash = ?", (_hash(token),))


async def end_user_sessions(store: Store, user_id: int, *, keep: str | None = None) -> None:
    """End every session of user_id but the one whose token is keep (the page that changed the password)."""
    async with store.transaction() as db:
        await db.execute(
            "DELETE FROM sessions WHERE user_id = ? AND token_hash != ?",
            (user_id, _hash(keep) if keep is not None else ""),
        )
