"""Accounts: scrypt passwords, pending until approved, names stored verbatim; sign-in sessions."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from llmgw.store import Store
from llmgw.store.scopes import DEFAULT_PROJECT_ID
from llmgw.store.sessions import create_session, end_session, end_user_sessions, lookup_session
from llmgw.store.users import (
    AccountError,
    approve_user,
    authenticate,
    create_user,
    disable_user,
    ensure_admin,
    get_user_by_email,
    hash_password,
    list_users,
    promote_user,
    set_password,
    verify_password,
)

# An address legal by its shape, full of what SQL and HTML treat specially.
NASTY_EMAIL = "o'brien\";DROP/**/TABLE/**/users;--<script>alert(1)</script>&amp;@ex%ample.com"


class TestPasswords:
    async def test_a_password_is_stored_as_an_scrypt_hash_that_verifies_only_itself(self) -> None:
        stored = await hash_password("correct horse")
        assert stored.startswith("scrypt$32768$8$1$") and "correct horse" not in stored
        assert await verify_password("correct horse", stored)
        assert not await verify_password("correct horsf", stored)

    async def test_two_hashes_of_one_password_differ_by_their_salt(self) -> None:
        assert await hash_password("same password") != await hash_password("same password")

    async def test_a_malformed_stored_hash_never_verifies(self) -> None:
        assert not await verify_password("x", "plaintext")
        assert not await verify_password("x", "bcrypt$1$2$3$a$b")

    async def test_the_store_holds_no_plaintext_password(self, store: Store) -> None:
        await create_user(store, "a@example.com", "hunter2hunter2")
        row = tuple(await store.fetch_one("SELECT * FROM users") or ())
        assert not any("hunter2" in str(value) for value in row)


class TestAccounts:
    async def test_a_new_account_is_pending_until_approved_into_a_project(self, store: Store) -> None:
        user = await create_user(store, "new@example.com", "password1")
        assert user.status == "pending" and not user.active and user.project_id is None
        approved = await approve_user(store, user.id, DEFAULT_PROJECT_ID)
        assert approved.active and approved.project_id == DEFAULT_PROJECT_ID

    async def test_promoting_a_pending_account_makes_it_an_active_administrator(self, store: Store) -> None:
        user = await create_user(store, "boss@example.com", "password1")
        promoted = await promote_user(store, user.id)
        assert promoted.is_admin and promoted.active

    async def test_a_disabled_account_stays_listed_but_is_no_longer_active(self, store: Store) -> None:
        user = await create_user(store, "gone@example.com", "password1", status="active")
        disabled = await disable_user(store, user.id)
        assert disabled.status == "disabled" and not disabled.active
        assert [u.email for u in await list_users(store)] == ["gone@example.com"]

    async def test_an_email_taken_in_another_case_is_refused(self, store: Store) -> None:
        await create_user(store, "Ann@Example.com", "password1")
        with pytest.raises(AccountError, match=r"there is already an account for ann@example\.com"):
            await create_user(store, "ann@example.com", "password1")

    async def test_a_text_without_an_at_sign_or_with_spaces_is_not_an_email(self, store: Store) -> None:
        for bad in ("nobody", "@example.com", "a b@example.com", "ann@"):
            with pytest.raises(AccountError, match="is not an email address"):
                await create_user(store, bad, "password1")

    async def test_a_short_password_is_refused_saying_how_long_it_must_be(self, store: Store) -> None:
        with pytest.raises(AccountError, match="at least 8 characters"):
            await create_user(store, "a@example.com", "short")

    async def test_an_email_full_of_sql_and_html_metacharacters_is_stored_verbatim(
        self, store: Store
    ) -> None:
        user = await create_user(store, NASTY_EMAIL, "password1")
        assert user.email == NASTY_EMAIL
        found = await get_user_by_email(store, NASTY_EMAIL)
        assert found is not None and found.email == NASTY_EMAIL
        assert [u.email for u in await list_users(store)] == [NASTY_EMAIL]

    async def test_changing_an_unknown_user_says_there_is_none(self, store: Store) -> None:
        with pytest.raises(AccountError, match="there is no user 42"):
            await promote_user(store, 42)


class TestAuthenticate:
    async def test_the_right_password_returns_the_account_whatever_the_emails_case(
        self, store: Store
    ) -> None:
        user = await create_user(store, "ann@example.com", "password1", status="active")
        assert await authenticate(store, "ANN@example.com", "password1") == user

    async def test_a_wrong_password_or_an_unknown_email_returns_none(self, store: Store) -> None:
        await create_user(store, "ann@example.com", "password1", status="active")
        assert await authenticate(store, "ann@example.com", "password2") is None
        assert await authenticate(store, "bob@example.com", "password1") is None

    async def test_a_changed_password_replaces_the_old_one(self, store: Store) -> None:
        user = await create_user(store, "ann@example.com", "password1", status="active")
        await set_password(store, user.id, "password2")
        assert await authenticate(store, "ann@example.com", "password1") is None
        assert await authenticate(store, "ann@example.com", "password2") is not None


class TestEnsureAdmin:
    async def test_it_creates_an_active_administrator_whose_generated_password_works(
        self, store: Store
    ) -> None:
        password = await ensure_admin(store, "root@example.com")
        assert password is not None and len(password) >= 20
        user = await authenticate(store, "root@example.com", password)
        assert user is not None and user.is_admin and user.active
        assert user.project_id == DEFAULT_PROJECT_ID

    async def test_a_second_call_returns_none_and_keeps_the_first_password(self, store: Store) -> None:
        password = await ensure_admin(store, "root@example.com")
        assert password is not None
        assert await ensure_admin(store, "root@example.com") is None
        assert await authenticate(store, "root@example.com", password) is not None


class TestSessions:
    async def test_a_session_is_found_by_its_token_and_only_its_hash_is_stored(self, store: Store) -> None:
        user = await create_user(store, "ann@example.com", "password1", status="active")
        token, session = await create_session(store, user.id, ttl_s=3600)
        assert await lookup_session(store, token) == session
        assert session.csrf and session.csrf != token
        assert token not in str([tuple(r) for r in await store.fetch_all("SELECT token_hash FROM sessions")])

    async def test_an_expired_session_is_not_found(self, store: Store) -> None:
        user = await create_user(store, "ann@example.com", "password1", status="active")
        token, session = await create_session(store, user.id, ttl_s=-1)
        assert session.expires_at < datetime.now(UTC)
        assert await lookup_session(store, token) is None

    async def test_an_ended_session_is_not_found(self, store: Store) -> None:
        user = await create_user(store, "ann@example.com", "password1", status="active")
        token, _ = await create_session(store, user.id, ttl_s=3600)
        await end_session(store, token)
        assert await lookup_session(store, token) is None

    async def test_ending_a_users_sessions_can_keep_the_current_one(self, store: Store) -> None:
        user = await create_user(store, "ann@example.com", "password1", status="active")
        here, _ = await create_session(store, user.id, ttl_s=3600)
        elsewhere, _ = await create_session(store, user.id, ttl_s=3600)
        await end_user_sessions(store, user.id, keep=here)
        assert await lookup_session(store, here) is not None
        assert await lookup_session(store, elsewhere) is None
