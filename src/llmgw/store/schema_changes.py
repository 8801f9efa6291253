"""A migration, what its statements do to the schema in words, and whether the previous release survives it.

During a roll of several control planes (docs/operations.md, Upgrading) the previous release and the
new one share the store: the first new server applies the new migrations while old servers still run
on it. A migration that only adds (a table, an index, rows, a column the old server's inserts may leave
out) leaves every old query working: it *expands*. One that drops or renames what the old release reads,
or adds a column its inserts do not fill, *contracts*: it belongs in a later release than the one that
stopped using what it removes. Read from the statements themselves, so that a migration cannot be
described as expanding while it drops a column.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Sequence

import attrs


@attrs.frozen
class NeverReuseIds:
    """A step of its own, not one statement: from it on, the table never gives out an id it gave before,
    even once that row is deleted, nor one that rows of other tables still name.

    A new row that took a deleted one's id would inherit everything still filed under it: a new project
    its usage and what its budget counts as spent, a new key or account the records of the old one.
    PostgreSQL's sequences never go back; SQLite gives an INTEGER PRIMARY KEY table's highest id again
    once that row is deleted, unless the table is declared AUTOINCREMENT, which SQLite cannot add to an
    existing table: store/ids.py rebuilds it (same columns, rows, constraints and indexes). What a
    store made earlier already forgot (a deleted highest row) is read back from named_by, each a query
    of one number: the highest id of this table other rows name, usage of a deleted project among them.

    The previous release reads and writes the table as before, so the step only expands the schema.
    """

    table: str
    named_by: Sequence[str] = ()


# A migration's step: one SQL statement, written for SQLite (dialect.py translates it for PostgreSQL),
# or a step store/ids.py carries out on each database in its own way.
Statement = str | NeverReuseIds


@attrs.frozen
class Migration:
    """One step of the schema: what it does in words (`llmgw store migrate --check` prints it), and its
    statements.

    A migration a release ships must let the previous release keep running on the same store while
    the control planes are rolled one by one (docs/operations.md, Upgrading): it only expands the
    schema (new tables, new nullable or defaulted columns, new indexes, rows), and what a release
    stops using is removed by a contracting migration of a later release. unused_since names the
    release from which no llmgw reads what a contracting migration removes; None for expand-only.
    tests/store/test_schema_changes.py holds every migration to this.
    """

    does: str
    statements: Sequence[Statement]
    unused_since: str | None = None


class Kind(enum.Enum):
    EXPAND = "expand"
    CONTRACT = "contract"


@attrs.frozen
class Change:
    """One statement's effect: `adds column projects.models`, and its kind."""

    does: str
    kind: Kind


_NAME = r"[\"`]?(\w+)[\"`]?"
# Each pattern, tried in order on the statement with its whitespace made single spaces; the first that
# matches says what it does. Anything else is taken for contracting: a statement this cannot read
# must be looked at by a person, and declared.
_EXPANDS = (
    (re.compile(rf"^CREATE TABLE (?:IF NOT EXISTS )?{_NAME}", re.I), "creates table {0}"),
    (
        re.compile(rf"^CREATE (?:UNIQUE )?INDEX (?:IF NOT EXISTS )?{_NAME} ON {_NAME}", re.I),
        "creates index {0} on {1}",
    ),
    (re.compile(rf"^INSERT INTO {_NAME}", re.I), "adds rows to {0}"),
    (re.compile(rf"^UPDATE {_NAME}", re.I), "fills in rows of {0}"),
)
_ADD_COLUMN = re.compile(rf"^ALTER TABLE {_NAME} ADD (?:COLUMN )?{_NAME}(.*)$", re.I)
_CONTRACTS = (
    (re.compile(rf"^DROP TABLE (?:IF EXISTS )?{_NAME}", re.I), "drops table {0}"),
    (re.compile(rf"^DROP INDEX (?:IF EXISTS )?{_NAME}", re.I), "drops index {0}"),
    (re.compile(rf"^ALTER TABLE {_NAME} DROP (?:COLUMN )?{_NAME}", re.I), "drops column {0}.{1}"),
    (
        re.compile(rf"^ALTER TABLE {_NAME} RENAME (?:COLUMN )?{_NAME} TO {_NAME}", re.I),
        "renames column {0}.{1} to {2}",
    ),
    (re.compile(rf"^ALTER TABLE {_NAME} RENAME TO {_NAME}", re.I), "renames table {0} to {1}"),
    (re.compile(rf"^DELETE FROM {_NAME}", re.I), "deletes rows of {0}"),
)


def change(statement: Statement) -> Change:
    """What one migration statement does, and whether the previous release survives it."""
    if isinstance(statement, NeverReuseIds):
        return Change(
            f"keeps the ids of {statement.table} from being given out again"
            " (SQLite: rebuilds the table AUTOINCREMENT, rows and indexes as they were)",
            Kind.EXPAND,
        )
    text = " ".join(statement.split())
    # RENAME TO is tried before ADD/DROP COLUMN: `ALTER TABLE t RENAME TO u` would not match them anyway.
    for pattern, words in _CONTRACTS:
        if match := pattern.match(text):
            return Change(words.format(*match.groups()), Kind.CONTRACT)
    if match := _ADD_COLUMN.match(text):
        table, column, rest = match.groups()
        declared = rest.upper()
        # The previous release's inserts name the columns it knows: a NOT NULL column without a default
        # would refuse every one of them.
        if "NOT NULL" in declared and "DEFAULT" not in declared:
            return Change(f"adds column {table}.{column}, NOT NULL without a default", Kind.CONTRACT)
        return Change(f"adds column {table}.{column}", Kind.EXPAND)
    for pattern, words in _EXPANDS:
        if match := pattern.match(text):
            return Change(words.format(*match.groups()), Kind.EXPAND)
    return Change(f"runs `{text[:60]}{'…' if len(text) > 60 else ''}`", Kind.CONTRACT)


def changes(migration: Migration) -> list[Change]:
    return [change(statement) for statement in migration.statements]


def kind(migration: Migration) -> Kind:
    """CONTRACT when any of its statements contracts the schema."""
    contracting = any(c.kind is Kind.CONTRACT for c in changes(migration))
    return Kind.CONTRACT if contracting else Kind.EXPAND


def _minor(version: str) -> tuple[int, int]:
    """(major, minor) of a release such as `0.11.2`."""
    parts = [int(part) for part in re.findall(r"\d+", version)]
    return parts[0], parts[1] if len(parts) > 1 else 0


def problems(migrations: Sequence[Migration], release: str) -> list[str]:
    """Why the migrations would break a roll from the release before `release` to it; empty when none.

    A contracting migration must say since which release nothing reads what it removes (unused_since),
    and that release must be older than the one before `release`, which still runs during the roll.
    """
    found = []
    for number, migration in enumerate(migrations, start=1):
        contracting = [c.does for c in changes(migration) if c.kind is Kind.CONTRACT]
        if contracting and migration.unused_since is None:
            found.append(
                f"migration {number} contracts the schema ({'; '.join(contracting)}) but does not say "
                "since which release nothing reads what it removes (unused_since): the previous "
                "release, still running during a roll, would fail"
            )
        elif contracting and migration.unused_since is not None:
            major, minor = _minor(release)
            if _minor(migration.unused_since) > (major, minor - 1):
                found.append(
                    f"migration {number} removes what releases before {migration.unused_since} read "
                    f"({'; '.join(contracting)}), and release {release} runs beside {major}.{minor - 1} "
                    "during a roll: ship it in a release after the one that stopped reading it"
                )
        elif migration.unused_since is not None:
            found.append(
                f"migration {number} is declared contracting (unused_since {migration.unused_since}) "
                "but only expands the schema: drop the declaration"
            )
    return found
