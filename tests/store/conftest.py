"""Every store test that is not about SQLite's file runs on both databases the store supports."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from llmgw.store import Store, open_store


@pytest.fixture(params=["sqlite", "postgresql"])
def database(request: pytest.FixtureRequest, tmp_path: Path) -> Path | str:
    """What open_store opens: an SQLite file of this test's own, or an empty PostgreSQL database of its
    own on the session's throwaway cluster (failing, saying what to install, without a PostgreSQL server)."""
    if request.param == "sqlite":
        return tmp_path / "llmgw.db"
    url: str = request.getfixturevalue("postgres_url")
    return url


@pytest.fixture
async def store(database: Path | str) -> AsyncIterator[Store]:
    async with open_store(database) as store:
        yield store
