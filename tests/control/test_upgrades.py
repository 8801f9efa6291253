"""A roll of the agents: a node at a time, each back at the new version before the next."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import attrs
import pytest

from llmgw.control.inventory import Inventory, Link
from llmgw.control.upgrades import Order, Roll, UpgradeRefused, Upgrades
from llmgw.proto.llmgw import v1 as pb
from llmgw.store import Store, open_store

from ..waiting import eventually, eventually_async

ORDER = Order(version="0.2.0", url="/srv/llmgw-0.2.0-py3-none-any.whl", sha256="ab" * 32, trial_s=5)


def _register(inventory: Inventory, node: str, version: str = "0.1.0") -> Link:
    return inventory.attach(pb.Register(node_id=node, agent_version=version))


def _asked(link: Link) -> list[pb.Upgrade]:
    asked = []
    while not link.outbox.empty():
        message = link.outbox.get_nowait()
        if message.upgrade.version:
            asked.append(message.upgrade)
    return asked


async def _roll(upgrades: Upgrades) -> Roll:
    roll = await upgrades.last()
    assert roll is not None
    return roll


async def _ended(upgrades: Upgrades, state: str) -> Roll:
    """The roll, once it has ended in state."""
    await eventually_async(lambda: _is(upgrades, state))
    return await _roll(upgrades)


async def _is(upgrades: Upgrades, state: str) -> bool:
    roll = await upgrades.last()
    return roll is not None and roll.state == state


async def _started_asking_n1(inventory: Inventory, upgrades: Upgrades) -> Link:
    """n1 and n2 at 0.1.0, the roll to 0.2.0 started, and n1 asked first: n2's link."""
    n1, n2 = _register(inventory, "n1"), _register(inventory, "n2")
    await upgrades.start(ORDER)
    await eventually(lambda: _asked(n1))
    return n2


def _leading() -> str | None:
    return None


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[Store]:
    async with open_store(tmp_path / "llmgw.db") as store:
        yield store


@pytest.fixture
async def rolling(store: Store) -> AsyncIterator[tuple[Inventory, Upgrades]]:
    inventory = Inventory(grace_s=30.0)
    upgrades = Upgrades(inventory, store, _leading, server_version="0.1.0")
    task = asyncio.create_task(upgrades.run())
    yield inventory, upgrades
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


class TestTheRoll:
    async def test_each_node_is_asked_only_once_the_one_before_is_back_at_the_new_version(
        self, rolling: tuple[Inventory, Upgrades]
    ) -> None:
        inventory, upgrades = rolling
        n2 = await _started_asking_n1(inventory, upgrades)
        assert _asked(n2) == []

        _register(inventory, "n1", "0.2.0")
        await eventually(lambda: _asked(n2))
        _register(inventory, "n2", "0.2.0")

        view = await _ended(upgrades, "done")
        assert [n.state for n in view.steps] == ["upgraded", "upgraded"]

    async def test_a_node_that_rolls_back_stops_the_roll_and_the_nodes_after_it_are_left_alone(
        self, rolling: tuple[Inventory, Upgrades]
    ) -> None:
        inventory, upgrades = rolling
        n2 = await _started_asking_n1(inventory, upgrades)
        said = "the new agent cannot start: ImportError: broken"
        inventory.upgrade_status(
            "n1", pb.UpgradeStatus(version="0.2.0", state="rolled back", detail=said, from_version="0.1.0")
        )

        view = await _ended(upgrades, "stopped")
        assert view.detail == f"stopped at n1: rolled back: {said}"
        assert [(n.node, n.state) for n in view.steps] == [("n1", "rolled back"), ("n2", "skipped")]
        assert _asked(n2) == []

    async def test_a_digest_refused_on_every_node_at_once_stops_the_roll_with_each_ones_words(
        self, rolling: tuple[Inventory, Upgrades]
    ) -> None:
        inventory, upgrades = rolling
        links = {node: _register(inventory, node) for node in ("n1", "n2", "n3")}
        await upgrades.start(attrs.evolve(ORDER, max_unavailable=3))
        for node, link in links.items():
            await eventually(lambda link=link: _asked(link))
            inventory.upgrade_status(
                node, pb.UpgradeStatus(version="0.2.0", state="refused", detail="sha256")
            )

        view = await _ended(upgrades, "stopped")
        assert {n.state for n in view.steps} == {"refused"}


async def test_a_roll_from_the_package_index_sends_each_node_the_index_and_the_digest(
    rolling: tuple[Inventory, Upgrades],
) -> None:
    inventory, upgrades = rolling
    n1 = _register(inventory, "n1")
    await upgrades.start(attrs.evolve(ORDER, url="", index_url="https://pypi.internal/simple/"))
    asked: list[pb.Upgrade] = []
    await eventually(lambda: asked.extend(_asked(n1)) or asked)
    assert [(a.url, a.index_url, a.sha256) for a in asked] == [
        ("", "https://pypi.internal/simple/", "ab" * 32)
    ]


class TestWhatIsRefusedBeforeAnyNodeIsAsked:
    async def test_a_roll_without_a_digest_is_refused_whatever_the_source(
        self, rolling: tuple[Inventory, Upgrades]
    ) -> None:
        inventory, upgrades = rolling
        _register(inventory, "n1")
        with pytest.raises(UpgradeRefused, match=r"give the sha256 of llmgw 0\.2\.0's wheel"):
            await upgrades.start(attrs.evolve(ORDER, url="", sha256=""))

    async def test_a_wheel_and_an_index_together_are_refused(
        self, rolling: tuple[Inventory, Upgrades]
    ) -> None:
        inventory, upgrades = rolling
        _register(inventory, "n1")
        with pytest.raises(UpgradeRefused, match="from the wheel or from the package index, not both"):
            await upgrades.start(attrs.evolve(ORDER, index_url="https://pypi.internal/simple/"))

    async def test_a_version_outside_the_window_is_refused_with_the_sentence_an_agent_would_get(
        self, rolling: tuple[Inventory, Upgrades]
    ) -> None:
        inventory, upgrades = rolling
        _register(inventory, "n1")
        with pytest.raises(UpgradeRefused, match=r"agent 0\.3\.0 is newer than this server accepts"):
            await upgrades.start(attrs.evolve(ORDER, version="0.3.0"))

    async def test_a_node_never_registered_is_named(self, rolling: tuple[Inventory, Upgrades]) -> None:
        inventory, upgrades = rolling
        _register(inventory, "n1")
        with pytest.raises(UpgradeRefused, match="no node called n9"):
            await upgrades.start(attrs.evolve(ORDER, nodes=("n1", "n9")))

    async def test_a_second_roll_while_one_runs_is_refused(self, rolling: tuple[Inventory, Upgrades]) -> None:
        inventory, upgrades = rolling
        _register(inventory, "n1")
        await upgrades.start(ORDER)
        with pytest.raises(UpgradeRefused, match="under way"):
            await upgrades.start(ORDER)

    async def test_a_dry_run_plans_without_asking_any_node(self, rolling: tuple[Inventory, Upgrades]) -> None:
        inventory, upgrades = rolling
        n1 = _register(inventory, "n1")
        _register(inventory, "n2", "0.2.0")
        gone = _register(inventory, "n3")
        inventory.detach(gone)

        view = await upgrades.start(ORDER, dry_run=True)

        assert view.state == "planned"
        assert [(n.node, n.state) for n in view.steps] == [
            ("n1", "waiting"),
            ("n2", "upgraded"),
            ("n3", "skipped"),
        ]
        assert _asked(n1) == []


async def test_a_node_back_at_the_new_version_says_so_and_not_what_it_said_before_its_restart(
    rolling: tuple[Inventory, Upgrades],
) -> None:
    """`upgrade status` kept "restarting into …/versions/0.2.0", or the agent's own seconds beside TOOK."""
    inventory, upgrades = rolling
    n1 = _register(inventory, "n1")
    await upgrades.start(ORDER)
    await eventually(lambda: _asked(n1))
    restarting = "restarting into /var/lib/llmgw/versions/0.2.0"
    inventory.upgrade_status("n1", pb.UpgradeStatus(version="0.2.0", state="restarting", detail=restarting))
    await eventually_async(lambda: _said(upgrades, restarting))

    _register(inventory, "n1", "0.2.0")
    inventory.upgrade_status(
        "n1", pb.UpgradeStatus(version="0.2.0", state="upgraded", detail="upgraded from 0.1.0 in 3.2 s")
    )

    view = await _ended(upgrades, "done")
    assert [(n.state, n.detail) for n in view.steps] == [("upgraded", "registered running 0.2.0")]


async def _said(upgrades: Upgrades, detail: str) -> bool:
    roll = await upgrades.last()
    return roll is not None and roll.steps[0].detail == detail


async def test_a_standby_refuses_a_roll_naming_the_leader(store: Store) -> None:
    """It answered "no node has registered with this control plane": its agents are the leader's."""
    said = "this control plane is a standby; the leader is cp1 at 198.18.0.1:7443"
    upgrades = Upgrades(Inventory(grace_s=30.0), store, lambda: said, server_version="0.1.0")
    with pytest.raises(UpgradeRefused) as refused:
        await upgrades.start(ORDER)
    assert str(refused.value) == f"{said}: run `llmgw ctl upgrade` against the leader"


@pytest.fixture(params=["sqlite", "postgresql"])
async def shared_store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Store]:
    """The store two control planes share: an SQLite file, or a PostgreSQL database of this test's own."""
    where: Path | str = tmp_path / "llmgw.db"
    if request.param == "postgresql":
        where = request.getfixturevalue("postgres_url")
    async with open_store(where) as store:
        yield store


async def test_a_roll_under_way_is_carried_on_by_the_next_leader_from_where_it_stood(
    shared_store: Store,
) -> None:
    """The roll lived in the leader's memory: a standby that took over forgot it mid-way."""
    first, second = Inventory(grace_s=30.0), Inventory(grace_s=30.0)
    old = Upgrades(first, shared_store, _leading, server_version="0.1.0")
    leading = asyncio.create_task(old.run())
    await _started_asking_n1(first, old)
    # The leadership moves: the old leader's work is cancelled, and the agents find the new one,
    # n1 mid-way through its upgrade.
    leading.cancel()
    await asyncio.gather(leading, return_exceptions=True)
    n1, n2 = _register(second, "n1"), _register(second, "n2")
    new = Upgrades(second, shared_store, _leading, server_version="0.1.0")
    standing = await _roll(new)
    assert standing.state == "running"
    assert [(s.node, s.state) for s in standing.steps] == [("n1", "upgrading"), ("n2", "waiting")]

    leading = asyncio.create_task(new.run())
    try:
        _register(second, "n1", "0.2.0")
        await eventually(lambda: _asked(n2))
        _register(second, "n2", "0.2.0")
        view = await _ended(new, "done")
    finally:
        leading.cancel()
        await asyncio.gather(leading, return_exceptions=True)
    assert [(s.node, s.state) for s in view.steps] == [("n1", "upgraded"), ("n2", "upgraded")]
    assert _asked(n1) == [], "n1 was asked twice"
    # What a standby's `upgrade status` reads.
    assert (await _roll(old)).state == "done"
