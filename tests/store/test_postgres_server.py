"""A real server on a PostgreSQL store: unreachable at start is one sentence; away while running, the
gateway serves from memory and no usage is lost."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from llmgw import config
from llmgw.cli.exit import EXIT_ERROR
from llmgw.config import ProfileConfig
from llmgw.roles.dev import prepare_dev
from llmgw.store import open_store
from llmgw.store.quotas import set_limits
from llmgw.store.scopes import DEFAULT_PROJECT_ID, Scope
from tests.e2e.conftest import launch_dev, post_json, wait_until

from ..postgres import Cluster

pytestmark = pytest.mark.slow

# The sim at zero delay: the test waits on the store, not on generation.
_BODY = {"model": "sim-chat", "messages": [{"role": "user", "content": "one two three"}], "max_tokens": 8}


def _dev_server_yaml(tmp_path: Path, database: str) -> Path:
    """The dev system's server.yaml (which `--dev` keeps once written), its store at database."""
    dev_dir = tmp_path / ".llmgw-dev"
    setup = prepare_dev(dev_dir, ("server",))
    assert setup.server is not None
    model = setup.server.models[0]
    zero_delay = ProfileConfig(engine="sim", args=["--ttft-ms", "0", "--tokens-per-s", "0"])
    server = config.evolve(
        setup.server,
        database=database,
        listen="127.0.0.1:0",
        admin_listen="127.0.0.1:0",
        agent_listen="127.0.0.1:0",
        models=[config.evolve(model, profiles=[zero_delay])],
    )
    path = dev_dir / "server.yaml"
    path.write_text(config.dump(server))
    return path


def _start_refused(server_yaml: Path) -> str:
    """Start the server role; the one line it says (after checking exit 1 and no traceback)."""
    result = subprocess.run(
        [sys.executable, "-m", "llmgw", "--role=server", "--config", str(server_yaml)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == EXIT_ERROR, result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    lines = result.stderr.strip().splitlines()
    assert lines[-1].startswith("llmgw: "), result.stderr
    return lines[-1]


def _closed_port() -> int:
    """A loopback port nothing listens on (bound, then closed)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@contextlib.contextmanager
def _stopped(cluster: Cluster) -> Iterator[None]:
    """The session's cluster stopped for the block, started again after it whatever happens."""
    cluster.stop()
    try:
        yield
    finally:
        cluster.start()


def _usage(cluster: Cluster, url: str) -> tuple[int, int, int]:
    """(requests, prompt tokens, completion tokens) answered 200, as PostgreSQL has them."""
    database = url.rsplit("/", 1)[1]
    row = cluster.psql(
        "SELECT COALESCE(SUM(requests), 0), COALESCE(SUM(prompt_tokens), 0),"
        " COALESCE(SUM(completion_tokens), 0) FROM usage_daily WHERE status = 200",
        database,
    )
    requests, prompt, completion = row.split("|")
    return int(requests), int(prompt), int(completion)


class TestAPostgresqlThatCannotBeReachedAtStart:
    def test_a_closed_port_is_one_sentence_naming_the_address(self, tmp_path: Path) -> None:
        port = _closed_port()
        server_yaml = _dev_server_yaml(tmp_path, f"postgresql://llmgw:secret@127.0.0.1:{port}/llmgw")
        said = _start_refused(server_yaml)
        assert said.startswith(
            f"llmgw: cannot reach the PostgreSQL store at postgresql://llmgw@127.0.0.1:{port}"
        )
        assert "connection refused" in said
        assert "secret" not in said

    def test_a_stopped_cluster_is_one_sentence_naming_the_address(
        self, tmp_path: Path, postgres: Cluster, postgres_url: str
    ) -> None:
        server_yaml = _dev_server_yaml(tmp_path, postgres_url)
        with _stopped(postgres):
            said = _start_refused(server_yaml)
        assert said.startswith(f"llmgw: cannot reach the PostgreSQL store at {postgres_url} ("), said

    def test_a_database_that_does_not_exist_says_to_create_it(
        self, tmp_path: Path, postgres: Cluster
    ) -> None:
        server_yaml = _dev_server_yaml(tmp_path, postgres.url("nosuchdb"))
        said = _start_refused(server_yaml)
        assert said.startswith(f"llmgw: cannot reach the PostgreSQL store at {postgres.url('nosuchdb')} (")
        assert '"nosuchdb" does not exist; create it with `createdb`' in said


class TestAPostgresqlThatGoesAwayWhileTheServerRuns:
    def test_requests_with_a_known_key_are_served_and_their_usage_lands_exactly_when_it_is_back(
        self, tmp_path: Path, postgres: Cluster, postgres_url: str
    ) -> None:
        _dev_server_yaml(tmp_path, postgres_url)
        with launch_dev(tmp_path) as running:
            before = [post_json(f"{running.url}/v1/chat/completions", _BODY, running.key) for _ in range(5)]
            assert [status for status, _ in before] == [200] * 5
            # Everything so far (the launcher's readiness probe among it) written: the baseline.
            wait_until(lambda: _usage(postgres, postgres_url)[0] >= 6, 60, "the first usage in PostgreSQL")
            baseline = _usage(postgres, postgres_url)
            with _stopped(postgres):
                during = [
                    post_json(f"{running.url}/v1/chat/completions", _BODY, running.key) for _ in range(20)
                ]
                assert [status for status, _ in during] == [200] * 20
                # The writer has met the stopped store and said so, plainly.
                wait_until(
                    lambda: any("could not write usage to the store" in line for line in running.output),
                    60,
                    "the writer to notice the store is away",
                )
            sent = [reply["usage"] for _, reply in during]  # type: ignore[index]
            expected = (
                baseline[0] + 20,
                baseline[1] + sum(u["prompt_tokens"] for u in sent),
                baseline[2] + sum(u["completion_tokens"] for u in sent),
            )
            # Retried with backoff (at most 15 s apart): a generous deadline, not a timing claim.
            wait_until(
                lambda: _usage(postgres, postgres_url) == expected, 90, "the usage to reach PostgreSQL"
            )
            assert _usage(postgres, postgres_url) == expected
            outage = [json.loads(line) for line in running.output if "could not write usage" in line]
            assert outage and postgres_url.rsplit("/", 1)[1] in outage[0]["error"]
            assert not any("Traceback" in line for line in running.output)

    def test_a_limit_set_before_it_went_away_still_binds(
        self, tmp_path: Path, postgres: Cluster, postgres_url: str
    ) -> None:
        """Limits are held in memory: the gateway refuses past the project's rpm with the store down."""

        async def limit() -> None:
            async with open_store(postgres_url) as store:
                await set_limits(store, Scope("project", DEFAULT_PROJECT_ID), rpm=12, tpm=None)

        asyncio.run(limit())
        _dev_server_yaml(tmp_path, postgres_url)
        with launch_dev(tmp_path) as running, _stopped(postgres):
            during = [
                post_json(f"{running.url}/v1/chat/completions", _BODY, running.key)[0] for _ in range(20)
            ]
        assert 0 < during.count(200) <= 12 and during.count(429) >= 8, during
        assert during == sorted(during), "a request was admitted after one was refused"


class TestCommandsOnAPostgresqlStore:
    def test_commands_use_it_and_a_backup_says_to_use_pg_dump(
        self, tmp_path: Path, postgres_url: str
    ) -> None:
        server_yaml = _dev_server_yaml(tmp_path, postgres_url)
        created = subprocess.run(
            [sys.executable, "-m", "llmgw", "keys", "create", "ci", "--config", str(server_yaml)],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert created.returncode == 0, created.stderr
        listed = subprocess.run(
            [sys.executable, "-m", "llmgw", "keys", "list", "--config", str(server_yaml)],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert listed.returncode == 0 and "ci" in listed.stdout.split(), listed.stdout
        backup = subprocess.run(
            [
                sys.executable,
                "-m",
                "llmgw",
                "store",
                "backup",
                str(tmp_path / "b.db"),
                "--config",
                str(server_yaml),
            ],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert backup.returncode == EXIT_ERROR
        assert backup.stderr.strip() == (
            f"llmgw: the store is the PostgreSQL database {postgres_url}: back it up with PostgreSQL's own "
            f"tool, `pg_dump --format=custom --file={tmp_path / 'b.db'} DATABASE_URL` (docs/operations.md)"
        )
        assert not (tmp_path / "b.db").exists()
