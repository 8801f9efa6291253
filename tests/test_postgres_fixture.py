"""The tests' throwaway PostgreSQL cluster works, and gives each test a database of its own."""

from __future__ import annotations

from .postgres import Cluster


def test_each_test_gets_an_empty_database_of_its_own(postgres: Cluster, postgres_url: str) -> None:
    database = postgres_url.rsplit("/", 1)[1]
    postgres.psql("CREATE TABLE mine (n integer)", database)
    postgres.psql("INSERT INTO mine VALUES (7)", database)
    other = postgres.fresh_database().rsplit("/", 1)[1]
    assert postgres.psql("SELECT n FROM mine", database) == "7"
    assert postgres.psql("SELECT count(*) FROM pg_tables WHERE tablename = 'mine'", other) == "0"
