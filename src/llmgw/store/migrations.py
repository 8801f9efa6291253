"""The store's schema, as numbered migrations applied in order at open.

Migration N is MIGRATIONS[N - 1]. A migration is never edited once released:
a store that already applied it would never see the change. Add a new one.
Each migration is a sequence of single statements rather than one script,
because sqlite3's executescript commits whatever transaction is open, and a
half-applied migration must roll back with the rest. One set drives both
databases: statements are written for SQLite and dialect.py translates their
column types for PostgreSQL.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime

from llmgw.errors import StoreError
from llmgw.store.base import Queries, Store
from llmgw.store.ids import never_reuse

# Migration is declared beside what reads its statements (schema_changes.py); named here too, where
# everything that applies migrations imports it from.
from llmgw.store.schema_changes import Kind, NeverReuseIds, kind
from llmgw.store.schema_changes import Migration as Migration


class NewerSchema(StoreError):
    """The store was migrated by a later release, and a migration this one does not know contracts it
    (or was applied by a release that recorded no kinds)."""

    def __init__(self, found: int, known: int) -> None:
        super().__init__(
            f"the store is at schema version {found}, newer than this llmgw knows ({known}): "
            "it was written by a later release; upgrade llmgw"
        )
        self.found = found
        self.known = known


def _scoped(kind: str) -> tuple[str, str]:
    """The highest id of a scope of kind that a limit or a budget names."""
    return (
        f"SELECT MAX(scope_id) FROM limits WHERE scope_kind = '{kind}'",
        f"SELECT MAX(scope_id) FROM budgets WHERE scope_kind = '{kind}'",
    )


MIGRATIONS: Sequence[Migration] = (
    # 1: API keys. Only the sha256 of a key is kept, with its first characters
    # so a person can tell keys apart in `llmgw keys list` and revoke one.
    Migration(
        "creates table api_keys: API keys, kept as their sha256",
        (
            """
        CREATE TABLE api_keys (
            id INTEGER PRIMARY KEY,
            name TEXT NOT NULL,
            prefix TEXT NOT NULL UNIQUE,
            key_hash TEXT NOT NULL UNIQUE,
            created_at TEXT NOT NULL,
            revoked_at TEXT
        )
        """,
        ),
    ),
    # 2 (H7): people who sign in to the pages, their sessions, and which keys
    # each made on their profile. users.project_id names a project of the
    # hierarchy (orgs -> teams -> projects); no foreign key, because that table
    # arrives in a migration of its own.
    Migration(
        "creates tables users, sessions and user_keys: accounts for the pages and their sessions",
        (
            """
        CREATE TABLE users (
            id INTEGER PRIMARY KEY,
            email TEXT NOT NULL UNIQUE COLLATE NOCASE,
            password_hash TEXT,
            status TEXT NOT NULL CHECK (status IN ('pending', 'active', 'disabled')),
            is_admin INTEGER NOT NULL DEFAULT 0,
            project_id INTEGER,
            created_at TEXT NOT NULL
        )
        """,
            """
        CREATE TABLE sessions (
            token_hash TEXT PRIMARY KEY,
            user_id INTEGER NOT NULL REFERENCES users (id) ON DELETE CASCADE,
            csrf TEXT NOT NULL,
            created_at TEXT NOT NULL,
            expires_at TEXT NOT NULL
        )
        """,
            "CREATE INDEX sessions_by_user ON sessions (user_id)",
            """
        CREATE TABLE user_keys (
            key_id INTEGER PRIMARY KEY REFERENCES api_keys (id) ON DELETE CASCADE,
            user_id INTEGER NOT NULL REFERENCES users (id) ON DELETE CASCADE
        )
        """,
        ),
    ),
    # 3 (H6): the hierarchy keys belong to (orgs -> teams -> projects, a
    # `default` of each so a fresh install has somewhere to put its first
    # key), key expiry and model allow-lists, the limits and budgets of every
    # scope, and usage per day, key, project, model and status. Existing keys
    # join the default project. A scope is (kind, id) with kind one of key,
    # project, team, org: no foreign key, so one table serves all four.
    Migration(
        "creates the hierarchy (orgs, teams, projects), limits, budgets and daily usage; keys get a project",
        (
            "CREATE TABLE orgs (id INTEGER PRIMARY KEY, name TEXT NOT NULL UNIQUE)",
            """
        CREATE TABLE teams (
            id INTEGER PRIMARY KEY,
            org_id INTEGER NOT NULL REFERENCES orgs (id),
            name TEXT NOT NULL,
            UNIQUE (org_id, name)
        )
        """,
            """
        CREATE TABLE projects (
            id INTEGER PRIMARY KEY,
            team_id INTEGER NOT NULL REFERENCES teams (id),
            name TEXT NOT NULL,
            UNIQUE (team_id, name)
        )
        """,
            "INSERT INTO orgs (id, name) VALUES (1, 'default')",
            "INSERT INTO teams (id, org_id, name) VALUES (1, 1, 'default')",
            "INSERT INTO projects (id, team_id, name) VALUES (1, 1, 'default')",
            "ALTER TABLE api_keys ADD COLUMN project_id INTEGER NOT NULL DEFAULT 1",
            "ALTER TABLE api_keys ADD COLUMN expires_at TEXT",
            # A JSON list of model names; NULL means every model.
            "ALTER TABLE api_keys ADD COLUMN models TEXT",
            """
        CREATE TABLE limits (
            scope_kind TEXT NOT NULL CHECK (scope_kind IN ('key', 'project', 'team', 'org')),
            scope_id INTEGER NOT NULL,
            rpm INTEGER,
            tpm INTEGER,
            PRIMARY KEY (scope_kind, scope_id)
        )
        """,
            """
        CREATE TABLE budgets (
            scope_kind TEXT NOT NULL CHECK (scope_kind IN ('key', 'project', 'team', 'org')),
            scope_id INTEGER NOT NULL,
            amount REAL NOT NULL,
            period TEXT NOT NULL CHECK (period IN ('day', 'week', 'month', 'total')),
            PRIMARY KEY (scope_kind, scope_id)
        )
        """,
            # key_id 0: requests that carried no key (auth disabled).
            """
        CREATE TABLE usage_daily (
            day TEXT NOT NULL,
            key_id INTEGER NOT NULL,
            project_id INTEGER NOT NULL,
            model TEXT NOT NULL,
            status INTEGER NOT NULL,
            requests INTEGER NOT NULL,
            prompt_tokens INTEGER NOT NULL,
            completion_tokens INTEGER NOT NULL,
            cost REAL NOT NULL,
            latency_ms REAL NOT NULL,
            PRIMARY KEY (day, key_id, project_id, model, status)
        )
        """,
            "CREATE INDEX usage_by_project ON usage_daily (project_id, day)",
        ),
    ),
    # 4 (H13): models added while running (`llmgw ctl model add`), kept as the definition's text
    # so that a restart reads them the way the first add did, errors with their lines included.
    Migration(
        "creates table catalog_models: models added with `llmgw ctl model add`",
        (
            """
        CREATE TABLE catalog_models (
            name TEXT PRIMARY KEY,
            definition TEXT NOT NULL,
            source TEXT NOT NULL,
            added_at TEXT NOT NULL
        )
        """,
        ),
    ),
    # 5: the highest usage-journal record the usage table has, written in the same
    # transaction as the usage it covers, so a record is replayed at start only if it is missing.
    Migration(
        "creates table usage_journal: the highest usage-journal record the usage table has",
        (
            "CREATE TABLE usage_journal"
            " (id INTEGER PRIMARY KEY CHECK (id = 1), applied_seq INTEGER NOT NULL)",
            "INSERT INTO usage_journal (id, applied_seq) VALUES (1, 0)",
        ),
    ),
    # 6: prices set with `llmgw prices set` (before server.yaml's), and the models a project may
    # call: a JSON list of names, NULL for every model.
    Migration(
        "creates table prices: prices set with `llmgw prices set`; adds column projects.models",
        (
            """
        CREATE TABLE prices (
            model TEXT PRIMARY KEY,
            prompt_per_1k REAL NOT NULL,
            completion_per_1k REAL NOT NULL,
            set_at TEXT NOT NULL
        )
        """,
            "ALTER TABLE projects ADD COLUMN models TEXT",
        ),
    ),
    # 7: email addresses unique whatever their case, in a form both databases index: PostgreSQL has no
    # COLLATE NOCASE (the users table's own UNIQUE is case-blind only on SQLite), and the lookups
    # match lower(email) so that they use this index on both.
    Migration(
        "creates index users_by_email: email addresses unique whatever their case, on both databases",
        ("CREATE UNIQUE INDEX users_by_email ON users (lower(email))",),
    ),
    # 8: what each gateway holds of a scope's rpm, tpm or budget when several share a PostgreSQL store
    # (gateway/allowance.py); unused on SQLite, whose one gateway counts in memory. expires_at is in
    # seconds of the database's own clock, so that the gateways' clocks never need to agree.
    Migration(
        "creates table allowance_leases: what each gateway holds of a limit when several share PostgreSQL",
        (
            """
        CREATE TABLE allowance_leases (
            scope TEXT NOT NULL,
            kind TEXT NOT NULL,
            holder TEXT NOT NULL,
            units REAL NOT NULL,
            expires_at REAL NOT NULL,
            PRIMARY KEY (scope, kind, holder)
        )
        """,
        ),
    ),
    # 9: the highest usage-journal record the usage table has, per journal: each server's journal has an
    # id of its own (the `journal-id` file in its directory) and numbers its records from its own
    # counter. Migration 5's one mark was the highest record any server had written, so with several
    # servers on one PostgreSQL another server's higher number made a server's unwritten usage look
    # stored (dropped after a failed write, skipped at replay after a kill).
    #
    # What migration 5's mark means to a journal an earlier release wrote: that release numbered a
    # journal's records from max(the mark, its own highest record) + 1 and raised the mark to every
    # record it wrote, so every record above the mark is certainly missing from the store, and every
    # record at or below it is there when one server wrote to the store (SQLite always; PostgreSQL with
    # one server). With several servers a record at or below it may be missing, but nothing tells which,
    # and replaying them would charge twice those that were written. So a journal without an id takes
    # the old mark as its start (gateway/journal.py writes it in the id file, with the id, before the
    # first row of this table names the journal): it replays exactly what the earlier release would
    # have replayed, and an upgrade loses nothing that release kept. usage_journal stays, read only.
    Migration(
        "creates table usage_journal_marks: the usage-journal mark of each server's journal",
        (
            """
        CREATE TABLE usage_journal_marks (
            journal_id TEXT PRIMARY KEY,
            applied_seq INTEGER NOT NULL
        )
        """,
        ),
    ),
    # 10: when each lease row next has a unit to give back, in seconds of the database's clock (NULL:
    # none busy, or a row an earlier release wrote): a gateway refused at a limit the others hold
    # tells its client when a request would really be admitted, not only when the next renewal is.
    Migration(
        "adds column allowance_leases.frees_at: when a lease next gives a unit back",
        ("ALTER TABLE allowance_leases ADD COLUMN frees_at REAL",),
    ),
    # 11: ids never given out again. SQLite gave a deleted org's, team's, project's, key's or account's
    # id to the next one made when it was the highest, and the new one inherited what is filed under
    # it: a new project showed the deleted one's usage, and its budget started at what that one spent.
    # A store made earlier has already forgotten a deleted highest id, except where other rows still
    # name it (usage, revoked keys and members of a deleted project, its limits and budget, a key's
    # owner): those ids are kept from being given out as well.
    Migration(
        "ids of orgs, teams, projects, keys and accounts are never given out again once deleted",
        (
            NeverReuseIds("orgs", ("SELECT MAX(org_id) FROM teams", *_scoped("org"))),
            NeverReuseIds("teams", ("SELECT MAX(team_id) FROM projects", *_scoped("team"))),
            NeverReuseIds(
                "projects",
                (
                    "SELECT MAX(project_id) FROM api_keys",
                    "SELECT MAX(project_id) FROM users",
                    "SELECT MAX(project_id) FROM usage_daily",
                    *_scoped("project"),
                ),
            ),
            NeverReuseIds(
                "api_keys",
                ("SELECT MAX(key_id) FROM usage_daily", "SELECT MAX(key_id) FROM user_keys", *_scoped("key")),
            ),
            NeverReuseIds(
                "users", ("SELECT MAX(user_id) FROM sessions", "SELECT MAX(user_id) FROM user_keys")
            ),
        ),
    ),
    # 12: the team and organisation each deleted project belonged to, written as it is deleted. Usage is
    # filed under the project alone, and team and org budgets counted only the projects still there:
    # deleting a project that had spent gave its team's and organisation's budgets that money back, a
    # way round them. A project an earlier release deleted left no such record; its usage counts
    # toward no team or organisation (nothing says which it was in). No foreign keys: the team and
    # organisation may be deleted after it, and what the project spent stays theirs.
    Migration(
        "creates table deleted_projects: the team and organisation of each project deleted, whose"
        " budgets still count what it spent",
        (
            """
        CREATE TABLE deleted_projects (
            project_id INTEGER NOT NULL PRIMARY KEY,
            team_id INTEGER NOT NULL,
            org_id INTEGER NOT NULL,
            name TEXT NOT NULL,
            deleted_at TEXT NOT NULL
        )
        """,
        ),
    ),
    # 13: how an account signs in (`local`: a password here; `oidc`: through the identity provider, which
    # made it) and the provider's groups at its last sign-in, for `llmgw users list` and the users page.
    Migration(
        "adds columns users.source and users.provider_groups: how an account signs in, and its groups",
        (
            "ALTER TABLE users ADD COLUMN source TEXT NOT NULL DEFAULT 'local'",
            "ALTER TABLE users ADD COLUMN provider_groups TEXT NOT NULL DEFAULT ''",
        ),
    ),
    # 14: each on-demand model's scale as the leader last decided it, and when any gateway last had a
    # request for it or held one for want of a replica (wall clock, seconds). A restart or a takeover
    # goes on from these: a new leader that knew none stopped the replica a held request had started,
    # and reset every idle timer. The last cold start measured is what `ctl models` expects of the next.
    Migration(
        "creates table model_scale: each on-demand model's replica count, why, its last request and "
        "its last cold start",
        (
            """
        CREATE TABLE model_scale (
            model TEXT PRIMARY KEY,
            replicas INTEGER NOT NULL,
            reason TEXT NOT NULL,
            decided_at REAL NOT NULL,
            last_request REAL NOT NULL DEFAULT 0,
            wanted_at REAL NOT NULL DEFAULT 0,
            eviction TEXT NOT NULL DEFAULT '',
            cold_start TEXT NOT NULL DEFAULT ''
        )
        """,
        ),
    ),
    # 15: the last roll of the agents to another release (`llmgw ctl upgrade`), as control/upgrades.py
    # writes it at each change: a control plane that takes the lead carries a roll under way on, where
    # it forgot it. One row, the last roll's.
    Migration(
        "creates table agent_upgrades: the last roll of the agents, kept across a change of leader",
        (
            """
        CREATE TABLE agent_upgrades (
            which TEXT NOT NULL PRIMARY KEY,
            roll TEXT NOT NULL,
            updated_at TEXT NOT NULL
        )
        """,
        ),
    ),
)


# The migrations, among those applied, that only expand the schema, each recorded as it is applied: a
# server of an earlier release then runs on a store a later one migrated when every migration it does not
# know only expands it, as when it restarts in the middle of a roll, or is what a roll back brings back
# (docs/operations.md, Upgrading). Migrations applied before this table recorded nothing count as
# contracting: an earlier release refused any newer store.
_EXPAND_ONLY = "CREATE TABLE IF NOT EXISTS schema_expand_only (version INTEGER PRIMARY KEY)"


async def contracting_after(queries: Queries, known: int, version: int) -> list[int]:
    """The applied migrations after known, up to version, not recorded as only expanding the schema."""
    tables = {str(row[0]) for row in await queries.fetch_all(queries.dialect.tables)}
    expanding: set[int] = set()
    if "schema_expand_only" in tables:
        rows = await queries.fetch_all("SELECT version FROM schema_expand_only WHERE version > ?", (known,))
        expanding = {int(row[0]) for row in rows}
    return [number for number in range(known + 1, version + 1) if number not in expanding]


async def schema_version(queries: Queries) -> int:
    """The highest migration applied; 0 for a new store."""
    tables = {str(row[0]) for row in await queries.fetch_all(queries.dialect.tables)}
    if "schema_version" not in tables:
        return 0
    return int(await queries.fetch_value("SELECT COALESCE(MAX(version), 0) FROM schema_version"))


async def migrate(store: Store, migrations: Sequence[Migration] = MIGRATIONS) -> int:
    """Apply the migrations the store lacks in one transaction; returns the schema version.

    A store a later release migrated is refused (NewerSchema) unless every migration this release does
    not know only expanded it: this release's queries still work there.

    Two servers opening a new store at once must not both apply migration 1: on SQLite the
    transaction's BEGIN IMMEDIATE takes the write lock before the version is read; on PostgreSQL
    the dialect's migration lock makes the second wait, then find the migrations applied.
    """
    async with store.transaction() as tx:
        if tx.dialect.migration_lock is not None:
            await tx.fetch_all(tx.dialect.migration_lock)
        await tx.schema(
            "CREATE TABLE IF NOT EXISTS schema_version"
            " (version INTEGER PRIMARY KEY, applied_at TEXT NOT NULL)"
        )
        await tx.schema(_EXPAND_ONLY)
        current = await schema_version(tx)
        if current > len(migrations):
            if await contracting_after(tx, len(migrations), current):
                raise NewerSchema(current, len(migrations))
            return current
        for version, migration in enumerate(migrations, start=1):
            if version <= current:
                continue
            for statement in migration.statements:
                if isinstance(statement, NeverReuseIds):
                    await never_reuse(tx, statement)
                else:
                    await tx.schema(statement)
            await tx.execute(
                "INSERT INTO schema_version (version, applied_at) VALUES (?, ?)",
                (version, datetime.now(UTC).isoformat(timespec="seconds")),
            )
            if kind(migration) is Kind.EXPAND:
                await tx.execute("INSERT INTO schema_expand_only (version) VALUES (?)", (version,))
        if current < len(migrations) and tx.dialect.realign_ids is not None:
            await tx.execute(tx.dialect.realign_ids)
    return len(migrations)
