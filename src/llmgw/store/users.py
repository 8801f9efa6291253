"""People who sign in to the pages: their accounts, passwords (scrypt) and state.

An account is pending until an administrator approves it into a project,
active after that, and disabled when an administrator says so. Only active
accounts may sign in; a disabled account keeps its row, so its keys and its
usage still name someone.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import secrets
from datetime import UTC, datetime
from typing import Literal

import attrs

from llmgw.errors import LlmgwError
from llmgw.store.base import Duplicate, Row, Store
from llmgw.store.scopes import DEFAULT_PROJECT_ID

Status = Literal["pending", "active", "disabled"]

# scrypt with n=2**15, r=8: 32 MiB and ~50 ms per hash, so that a stolen
# store costs an attacker that much per guess per account. Deliberately slow,
# which is why it always runs in a thread, never on the event loop.
_N, _R, _P = 2**15, 8, 1
_MAXMEM = 64 * 1024 * 1024
_SALT_BYTES = 16
_HASH_BYTES = 32
MIN_PASSWORD = 8
# Long enough that a generated password is never the weak link; letters and
# digits only, so that it survives being pasted from a terminal.
_GENERATED_PASSWORD_BYTES = 18


class AccountError(LlmgwError):
    """A change to an account that cannot be made, said in a sentence for the person who asked."""


@attrs.frozen
class User:
    id: int
    email: str
    status: Status
    is_admin: bool
    project_id: int | None
    created_at: datetime
    # How the account signs in: "local" (a password here) or "oidc" (made by the identity provider).
    source: str = "local"
    # The provider's groups at the account's last sign-in through it.
    groups: tuple[str, ...] = ()

    @property
    def active(self) -> bool:
        return self.status == "active"


def _now() -> datetime:
    return datetime.now(UTC).replace(microsecond=0)


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _scrypt(password: str, salt: bytes, n: int, r: int, p: int) -> bytes:
    return hashlib.scrypt(password.encode(), salt=salt, n=n, r=r, p=p, maxmem=_MAXMEM, dklen=_HASH_BYTES)


async def hash_password(password: str) -> str:
    """The stored form: `scrypt$n$r$p$salt$hash`, its parameters kept so that they can be raised later."""
    salt = secrets.token_bytes(_SALT_BYTES)
    digest = await asyncio.to_thread(_scrypt, password, salt, _N, _R, _P)
    return f"scrypt${_N}${_R}${_P}${_b64(salt)}${_b64(digest)}"


async def verify_password(password: str, stored: str) -> bool:
    """Whether password is the one stored was made from; False for anything malformed."""
    try:
        scheme, n, r, p, salt, digest = stored.split("$")
        if scheme != "scrypt":
            return False
        expected = base64.b64decode(digest)
        actual = await asyncio.to_thread(_scrypt, password, base64.b64decode(salt), int(n), int(r), int(p))
    except ValueError:
        return False
    return hmac.compare_digest(actual, expected)


def generate_password() -> str:
    return secrets.token_urlsafe(_GENERATED_PASSWORD_BYTES).replace("-", "x").replace("_", "y")


def check_password(password: str) -> None:
    if len(password) < MIN_PASSWORD:
        raise AccountError(f"a password needs at least {MIN_PASSWORD} characters")


def normalise_email(email: str) -> str:
    """The email as it is stored and looked up; AccountError when it cannot be an address.

    Only the shape is checked (something@something, no spaces): quotes, angle
    brackets and the like are legal in an address and are kept verbatim.
    """
    text = email.strip()
    local, at, domain = text.rpartition("@")
    if not at or not local or not domain or any(c.isspace() or ord(c) < 32 for c in text):
        raise AccountError(f"'{text}' is not an email address (expected name@domain, without spaces)")
    if len(text) > 254:
        raise AccountError("an email address has at most 254 characters")
    return text


def _user(row: Row) -> User:
    return User(
        id=row["id"],
        email=row["email"],
        status=row["status"],
        is_admin=bool(row["is_admin"]),
        project_id=row["project_id"],
        created_at=datetime.fromisoformat(row["created_at"]),
        source=row["source"],
        groups=tuple(group for group in row["provider_groups"].split("\n") if group),
    )


async def create_user(
    store: Store,
    email: str,
    password: str | None,
    *,
    status: Status = "pending",
    is_admin: bool = False,
    project_id: int | None = None,
) -> User:
    """A new account; with password None it cannot sign in until a password is set."""
    email = normalise_email(email)
    if password is not None:
        check_password(password)
    password_hash = await hash_password(password) if password is not None else None
    created_at = _now()
    try:
        async with store.transaction() as db:
            user_id = await db.insert(
                "INSERT INTO users (email, password_hash, status, is_admin, project_id, created_at)"
                " VALUES (?, ?, ?, ?, ?, ?)",
                (email, password_hash, status, int(is_admin), project_id, created_at.isoformat()),
            )
    except Duplicate:
        raise AccountError(f"there is already an account for {email}") from None
    return User(
        id=user_id,
        email=email,
        status=status,
        is_admin=is_admin,
        project_id=project_id,
        created_at=created_at,
    )


async def ensure_admin(store: Store, email: str) -> str | None:
    """An active administrator, in the default project, with a generated password, which is returned.

    None when an account with that email already exists: it is left as it is,
    password included, because running `llmgw server init` twice must not lock
    the administrator out.
    """
    if await get_user_by_email(store, email) is not None:
        return None
    password = generate_password()
    try:
        await create_user(
            store, email, password, status="active", is_admin=True, project_id=DEFAULT_PROJECT_ID
        )
    except AccountError:
        # Created by another process between the check and the insert.
        if await get_user_by_email(store, email) is not None:
            return None
        raise
    return password


# Email addresses are matched without regard to case (people type them both ways), through the
# lower(email) index both databases have (migration 7).
_BY_EMAIL = "SELECT * FROM users WHERE lower(email) = lower(?)"


async def get_user(store: Store, user_id: int) -> User | None:
    row = await store.fetch_one("SELECT * FROM users WHERE id = ?", (user_id,))
    return _user(row) if row is not None else None


async def get_user_by_email(store: Store, email: str) -> User | None:
    """Email addresses are matched without regard to case: people type them both ways."""
    row = await store.fetch_one(_BY_EMAIL, (email.strip(),))
    return _user(row) if row is not None else None


async def list_users(store: Store) -> list[User]:
    """Every account, oldest first."""
    return [_user(row) for row in await store.fetch_all("SELECT * FROM users ORDER BY id")]


async def _update(store: Store, user_id: int, assignments: str, values: tuple[object, ...]) -> User:
    async with store.transaction() as db:
        changed = await db.execute(f"UPDATE users SET {assignments} WHERE id = ?", (*values, user_id))
    user = await get_user(store, user_id) if changed else None
    if user is None:
        raise AccountError(f"there is no user {user_id}; `llmgw users list` shows them")
    return user


async def approve_user(store: Store, user_id: int, project_id: int) -> User:
    """Make the account active, a member of project_id (and so of its team and organisation)."""
    return await _update(store, user_id, "status = 'active', project_id = ?", (project_id,))


async def leave_project(store: Store, user_id: int) -> User:
    """Take the account out of its project: it still signs in, and creates no keys until it joins one."""
    return await _update(store, user_id, "project_id = NULL", ())


async def promote_user(store: Store, user_id: int) -> User:
    """Make the account an administrator; a pending one becomes active too, since an admin approves."""
    return await _update(
        store,
        user_id,
        "is_admin = 1, status = CASE WHEN status = 'pending' THEN 'active' ELSE status END",
        (),
    )


async def disable_user(store: Store, user_id: int) -> User:
    """Stop the account signing in; its sessions end at once (the caller ends them: sessions.py)."""
    return await _update(store, user_id, "status = 'disabled'", ())


async def revoke_user_keys(store: Store, user_id: int) -> int:
    """Revoke every live key user_id made on their profile (auth.disabled_user_keys: revoke); how many."""
    async with store.transaction() as db:
        return await db.execute(
            "UPDATE api_keys SET revoked_at = ? WHERE revoked_at IS NULL"
            " AND id IN (SELECT key_id FROM user_keys WHERE user_id = ?)",
            (_now().isoformat(), user_id),
        )


async def set_password(store: Store, user_id: int, password: str) -> User:
    check_password(password)
    return await _update(store, user_id, "password_hash = ?", (await hash_password(password),))


async def authenticate(store: Store, email: str, password: str) -> User | None:
    """The account email names if password is its password; None otherwise, whichever part was wrong.

    The account may be pending or disabled: the caller says so to the person,
    who has proved they own it.
    """
    row = await store.fetch_one(_BY_EMAIL, (email.strip(),))
    if row is None or row["password_hash"] is None:
        # Hash anyway, so that the time taken does not tell which emails have accounts.
        await verify_password(password, _DUMMY_HASH)
        return None
    if not await verify_password(password, row["password_hash"]):
        return None
    return _user(row)


# A hash of nothing in particular with the real parameters, for the timing above.
_DUMMY_HASH = f"scrypt${_N}${_R}${_P}${_b64(b'0' * _SALT_BYTES)}${_b64(b'0' * _HASH_BYTES)}"


async def has_password(store: Store, user_id: int) -> bool:
    """Whether the account can sign in with a password (one signed in through a provider has none)."""
    row = await store.fetch_one("SELECT password_hash FROM users WHERE id = ?", (user_id,))
    return row is not None and row[0] is not None


async def link_key(store: Store, key_id: int, user_id: int) -> None:
    """Record that user_id created key_id on their profile, so that they may list and revoke it."""
    async with store.transaction() as db:
        await db.execute("INSERT INTO user_keys (key_id, user_id) VALUES (?, ?)", (key_id, user_id))


async def user_key_ids(store: Store, user_id: int) -> list[int]:
    rows = await store.fetch_all("SELECT key_id FROM user_keys WHERE user_id = ? ORDER BY key_id", (user_id,))
    return [int(row[0]) for row in rows]
