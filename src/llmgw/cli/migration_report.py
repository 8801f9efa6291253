"""What `llmgw store migrate` prints: each pending migration, what it does, and whether it is safe to
apply while the previous release still runs on the store."""

from __future__ import annotations

from collections.abc import Iterator

from llmgw.store.pending import Pending
from llmgw.store.schema_changes import Kind, changes, kind


def _plural(count: int) -> str:
    return f"{count} migration{'' if count == 1 else 's'}"


def _heading(pending: Pending, applied: bool) -> str:
    count, where = _plural(len(pending.migrations)), pending.where
    if applied:
        return f"applied {count} to the store {where}: schema version {pending.version} -> {pending.known}"
    if pending.version == 0:
        return f"the store {where} has no schema yet: {count} to apply, to version {pending.known}"
    return f"the store {where} is at schema version {pending.version}: {count} pending, to {pending.known}"


def migration_lines(pending: Pending, applied: bool) -> Iterator[str]:
    """The report, line by line; applied: the migrations were just applied rather than only read."""
    if pending.newer:
        yield (
            f"the store {pending.where} is at schema version {pending.version}, newer than this llmgw "
            f"knows ({pending.known}); every later migration only expands it, so this release runs on it: "
            "nothing to apply"
        )
        return
    if not pending.migrations:
        yield f"the store {pending.where} is at schema version {pending.version}: nothing to apply"
        return
    yield _heading(pending, applied)
    contracting: list[str] = []
    for number, migration in pending.migrations:
        sort = kind(migration)
        if sort is Kind.CONTRACT:
            contracting.append(f"{number} (nothing reads what it removes since {migration.unused_since})")
        yield f"  {number:>3}  {sort.value:<8}  {migration.does}"
        for change in changes(migration):
            yield f"                 - {change.does}"
    if applied:
        return
    if not contracting:
        yield "every one only expands the schema: safe to apply while the previous release still runs"
    else:
        yield (
            f"contracting: {', '.join(contracting)}; stop every server of an older release "
            "before applying (docs/operations.md, Upgrading)"
        )
