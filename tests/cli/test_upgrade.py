"""`llmgw ctl upgrade` and `upgrade status` against a real admin API on loopback, nodes played here."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from click.testing import CliRunner
from structlog.testing import capture_logs

from llmgw.adminapi import handlers as adminapi
from llmgw.adminapi.routes import mount
from llmgw.adminapi.upgrades import UPGRADES_KEY
from llmgw.catalog import Catalog
from llmgw.cli.ctl import ctl
from llmgw.cli.exit import EXIT_ERROR, EXIT_NOT_FOUND, EXIT_USAGE
from llmgw.config import ServerConfig
from llmgw.control.inventory import Inventory
from llmgw.control.upgrades import Upgrades
from llmgw.proto.llmgw import v1 as pb
from llmgw.store import open_store
from llmgw.web.admin_listener import API

CFG = ServerConfig()
SHA = "ab" * 32
BROKEN = "the new agent cannot start: ImportError: this build is broken"


@contextlib.asynccontextmanager
async def _serving(
    tmp_path: Path, standby: Callable[[], str | None] = lambda: None
) -> AsyncIterator[tuple[str, Inventory]]:
    """An admin API whose control plane rolls two nodes at 0.1.0; standby says whether it leads."""
    inventory = Inventory(30.0)
    for node in ("n1", "n2"):
        inventory.attach(pb.Register(node_id=node, agent_version="0.1.0"), f"10.0.0.{node[1]}:5000")
    async with open_store(tmp_path / "llmgw.db") as store:
        upgrades = Upgrades(inventory, store, standby, server_version="0.1.0")
        app = web.Application()
        adminapi.provide(app, CFG, inventory, Catalog(CFG))
        mount(app, [route for route in API if "upgrades" in route.path or route.path == "/api/v1/nodes"])
        app[UPGRADES_KEY] = upgrades
        rolling = asyncio.create_task(upgrades.run())
        with capture_logs():
            async with TestServer(app) as test_server:
                yield str(test_server.make_url("")).rstrip("/"), inventory
        rolling.cancel()
        await asyncio.gather(rolling, return_exceptions=True)


@pytest.fixture
async def server(tmp_path: Path) -> AsyncIterator[tuple[str, Inventory]]:
    async with _serving(tmp_path) as serving:
        yield serving


async def run(*args: str) -> tuple[int, str, str]:
    # In a thread: ctl runs its own event loop, and the server it talks to runs on this one.
    result = await asyncio.to_thread(CliRunner().invoke, ctl, list(args), catch_exceptions=False)
    return result.exit_code, result.stdout, result.stderr


async def _roll_back_when_asked(inventory: Inventory, node: str) -> pb.Upgrade:
    """n1's agent, as it would answer a release it cannot start; what it was asked."""
    link = inventory._links[node]
    while not (asked := (await link.outbox.get()).upgrade).version:
        continue
    said = pb.UpgradeStatus(version="0.2.0", state="rolled back", detail=BROKEN, from_version="0.1.0")
    inventory.upgrade_status(node, said)
    return asked


async def test_a_dry_run_says_which_nodes_would_be_upgraded_in_which_order(
    server: tuple[str, Inventory],
) -> None:
    code, out, err = await run(
        "--server", server[0], "upgrade", "--to", "0.2.0", "--wheel", "https://m/llmgw-0.2.0-py3-none-any.whl",
        "--sha256", SHA, "--nodes", "n2,n1", "--dry-run",
    )  # fmt: skip
    assert (code, err) == (0, "")
    assert out.splitlines() == [
        "upgrade to 0.2.0: planned (dry run), 0 s, 1 node(s) at a time",
        "NODE  FROM   STATE    TOOK  DETAIL",
        "n2    0.1.0  waiting  —",
        "n1    0.1.0  waiting  —",
    ]


async def test_the_digest_is_read_here_when_the_wheel_is_a_file_on_this_machine(
    server: tuple[str, Inventory], tmp_path: Path
) -> None:
    wheel = tmp_path / "llmgw-0.2.0-py3-none-any.whl"
    await asyncio.to_thread(wheel.write_bytes, b"a release")
    code, _, err = await run(
        "--server", server[0], "upgrade", "--to", "0.2.0", "--wheel", str(wheel), "--dry-run"
    )
    assert code == 0
    assert err == f"{wheel.name}: sha256 {hashlib.sha256(b'a release').hexdigest()}\n"


async def test_a_url_without_its_digest_is_refused_before_the_server_is_asked(
    server: tuple[str, Inventory],
) -> None:
    code, _, err = await run(
        "--server", server[0], "upgrade", "--to", "0.2.0", "--wheel", "https://m/llmgw-0.2.0-py3-none-any.whl"
    )
    assert code == EXIT_USAGE
    assert "give the wheel's digest with --sha256" in err


async def test_a_release_from_the_package_index_without_its_digest_is_refused_before_anything_is_sent(
    server: tuple[str, Inventory],
) -> None:
    url = server[0]
    code, _, err = await run("--server", url, "upgrade", "--to", "0.2.0")
    assert code == EXIT_USAGE
    assert err == (
        "llmgw ctl: give --sha256 of llmgw 0.2.0's wheel, as the registry lists it "
        "(pip download llmgw==0.2.0 --no-deps; sha256sum)\n"
    )
    code, _, err = await run("--server", url, "upgrade", "status")
    assert code == EXIT_NOT_FOUND, "the server was asked for a roll"


async def test_a_release_from_the_package_index_sends_the_digest_and_the_index_to_the_nodes(
    server: tuple[str, Inventory],
) -> None:
    url, inventory = server
    node = asyncio.create_task(_roll_back_when_asked(inventory, "n1"))
    code, _, _ = await run(
        "--server", url, "upgrade", "--to", "0.2.0", "--sha256", SHA,
        "--index-url", "https://pypi.internal/simple/", "--nodes", "n1",
    )  # fmt: skip
    asked = await node
    assert code == EXIT_ERROR
    assert (asked.url, asked.index_url, asked.sha256) == ("", "https://pypi.internal/simple/", SHA)


async def test_a_wheel_and_an_index_together_are_refused_in_words(server: tuple[str, Inventory]) -> None:
    code, _, err = await run(
        "--server", server[0], "upgrade", "--to", "0.2.0", "--wheel", "https://m/llmgw-0.2.0-py3-none-any.whl",
        "--sha256", SHA, "--index-url", "https://pypi.internal/simple/",
    )  # fmt: skip
    assert code == EXIT_USAGE
    assert "--index-url is where the release comes from without --wheel: give one or the other" in err


async def test_a_roll_that_stops_at_a_node_that_rolled_back_says_why_and_exits_1(
    server: tuple[str, Inventory],
) -> None:
    url, inventory = server
    node = asyncio.create_task(_roll_back_when_asked(inventory, "n1"))
    code, out, err = await run(
        "--server", url, "upgrade", "--to", "0.2.0", "--wheel", "/srv/llmgw-0.2.0-py3-none-any.whl",
        "--sha256", SHA,
    )  # fmt: skip
    await node
    assert code == EXIT_ERROR
    assert f"n1: rolled back ({BROKEN})" in err
    assert err.endswith(f"llmgw ctl: the upgrade to 0.2.0 stopped at n1: rolled back: {BROKEN}\n")
    assert "n2    0.1.0  skipped" in out

    code, status, _ = await run("--server", url, "upgrade", "status")
    assert code == 0 and status.startswith("upgrade to 0.2.0: stopped")
    _, nodes, _ = await run("--server", url, "nodes")
    assert f"n1: rolled back from 0.2.0: {BROKEN}" in nodes


async def test_status_before_any_roll_is_exit_4(server: tuple[str, Inventory]) -> None:
    code, _, err = await run("--server", server[0], "upgrade", "status")
    assert code == EXIT_NOT_FOUND
    assert "no upgrade of the agents has run yet" in err


async def test_a_trial_or_a_node_count_past_its_bound_is_refused_by_the_cli_and_the_api(
    server: tuple[str, Inventory],
) -> None:
    """trial_s of 10**20 cannot go down a node's stream (32 bits): a roll that died after it began."""
    url = server[0]
    base = ["--server", url, "upgrade", "--to", "0.2.0", "--wheel", "https://m/w.whl", "--sha256", SHA]
    for option, value, said in (
        (
            "--trial-s",
            "100000000000000000000",
            "--trial-s is 1e+20; it must be a whole number from 1 to 86,400",
        ),
        ("--trial-s", "0", "--trial-s is 0; it must be a whole number from 1 to 86,400"),
        (
            "--max-unavailable",
            "\u0663",
            "--max-unavailable is '\u0663'; write a whole number from 1 to 100,000",
        ),
    ):
        code, _, err = await run(*base, option, value, "--dry-run")
        assert code == EXIT_USAGE and said in err, err
    order = {"version": "0.2.0", "sha256": SHA, "url": "https://m/w.whl", "dry_run": True}
    async with aiohttp.ClientSession() as session:
        for field, value in (("trial_s", 10**20), ("max_unavailable", 100_001), ("trial_s", 0)):
            async with session.post(f"{url}/api/v1/upgrades", json={**order, field: value}) as reply:
                body = await reply.json()
                assert (
                    reply.status == 400
                    and f"{field} is {value}; it must be a whole number from 1 to" in (body["error"])
                )
        async with session.post(f"{url}/api/v1/upgrades", json={**order, "trial_s": 86_400}) as reply:
            assert reply.status == 200


async def test_a_roll_asked_of_a_standby_names_the_leader(tmp_path: Path) -> None:
    """A standby answered "no node has registered with this control plane": its agents are the leader's."""
    said = "this control plane is a standby; the leader is cp1 at 198.18.0.1:7443"
    async with _serving(tmp_path, standby=lambda: said) as (url, _):
        code, _, err = await run(
            "--server", url, "upgrade", "--to", "0.2.0", "--wheel", "/srv/llmgw-0.2.0-py3-none-any.whl",
            "--sha256", SHA,
        )  # fmt: skip
    assert code == EXIT_ERROR
    assert err == f"llmgw ctl: {said}: run `llmgw ctl upgrade` against the leader\n"
