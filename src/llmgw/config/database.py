"""server.yaml's `database` when it names PostgreSQL: read and checked where the config is loaded.

Here rather than in store/ because the config checks it and the store opens it, and config sits
below the store (tests/test_imports.py holds the layers).
"""

from __future__ import annotations

import urllib.parse

import attrs

SCHEMES = ("postgresql", "postgres")
_SHAPE = "postgresql://USER[:PASSWORD]@HOST[:PORT]/DATABASE"


def is_postgres_url(database: str) -> bool:
    """Whether server.yaml's `database` names PostgreSQL rather than an SQLite file."""
    return urllib.parse.urlsplit(database).scheme in SCHEMES


@attrs.frozen
class PostgresUrl:
    """`postgresql://USER[:PASSWORD]@HOST[:PORT]/DATABASE`, read and checked."""

    # With its password, if it has one: never printed (repr=False, and __str__ leaves it out).
    url: str = attrs.field(repr=False)
    user: str
    host: str
    port: int
    database: str

    @classmethod
    def parse(cls, url: str) -> PostgresUrl:
        """The URL's parts; ValueError saying what is wrong with it, for a person."""
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in SCHEMES:
            raise ValueError("a PostgreSQL store is written postgresql://USER@HOST[:PORT]/DATABASE")
        try:
            port = parts.port if parts.port is not None else 5432
        except ValueError:
            raise ValueError(
                f"its port is not a number from 1 to 65535 ({parts.netloc.rpartition(':')[2]})"
            ) from None
        if not 1 <= port <= 65535:
            raise ValueError(f"its port {port} is outside 1-65535")
        if not parts.hostname:
            raise ValueError(f"it names no host: write {_SHAPE}")
        if not parts.username:
            raise ValueError(f"it names no user: write {_SHAPE}")
        database = urllib.parse.unquote(parts.path.lstrip("/"))
        if not database or "/" in database:
            raise ValueError(f"it names no database: write {_SHAPE}")
        if parts.query or parts.fragment:
            raise ValueError("it has options after the database (?...); llmgw reads none")
        return cls(url, urllib.parse.unquote(parts.username), parts.hostname, port, database)

    def __str__(self) -> str:
        """How a person is told which store: never with its password."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"postgresql://{self.user}@{host}:{self.port}/{self.database}"
