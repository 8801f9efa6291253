"""A roll of the agents: a node at a time, each back at the new version before the next."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import attrs
import pytest

from llmgw.control.inventory import Inventory, Link
from llmgw.control.upgrades import Order, UpgradeRefused, Upgrades
from llmgw.proto.llmgw import v1 as pb

from ..waiting import eventually

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


def _state(upgrades: Upgrades) -> str:
    view = upgrades.view()
    return view.state if view is not None else ""


async def _started_asking_n1(inventory: Inventory, upgrades: Upgrades) -> Link:
    """n1 and n2 at 0.1.0, the roll to 0.2.0 started, and n1 asked first: n2's link."""
    n1, n2 = _register(inventory, "n1"), _register(inventory, "n2")
    upgrades.start(ORDER)
    await eventually(lambda: _asked(n1))
    return n2


@pytest.fixture
async def rolling() -> AsyncIterator[tuple[Inventory, Upgrades]]:
    inventory = Inventory(grace_s=30.0)
    upgrades = Upgrades(inventory, server_version="0.1.0")
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

        await eventually(lambda: _state(upgrades) == "done")
        view = upgrades.view()
        assert view is not None
        assert [n.state for n in view.nodes] == ["upgraded", "upgraded"]

    async def test_a_node_that_rolls_back_stops_the_roll_and_the_nodes_after_it_are_left_alone(
        self, rolling: tuple[Inventory, Upgrades]
    ) -> None:
        inventory, upgrades = rolling
        n2 = await _started_asking_n1(inventory, upgrades)
        said = "the new agent cannot start: ImportError: broken"
        inventory.upgrade_status(
            "n1", pb.UpgradeStatus(version="0.2.0", state="rolled back", detail=said, from_version="0.1.0")
        )

        await eventually(lambda: _state(upgrades) == "stopped")
        view = upgrades.view()
        assert view is not None
        assert view.detail == f"stopped at n1: rolled back: {said}"
        assert [(n.node, n.state) for n in view.nodes] == [("n1", "rolled back"), ("n2", "skipped")]
        assert _asked(n2) == []

    async def test_a_digest_refused_on_every_node_at_once_stops_the_roll_with_each_ones_words(
        self, rolling: tuple[Inventory, Upgrades]
    ) -> None:
        inventory, upgrades = rolling
        links = {node: _register(inventory, node) for node in ("n1", "n2", "n3")}
        upgrades.start(attrs.evolve(ORDER, max_unavailable=3))
        for node, link in links.items():
            await eventually(lambda link=link: _asked(link))
            inventory.upgrade_status(
                node, pb.UpgradeStatus(version="0.2.0", state="refused", detail="sha256")
            )

        await eventually(lambda: _state(upgrades) == "stopped")
        view = upgrades.view()
        assert view is not None
        assert {n.state for n in view.nodes} == {"refused"}


async def test_a_roll_from_the_package_index_sends_each_node_the_index_and_the_digest(
    rolling: tuple[Inventory, Upgrades],
) -> None:
    inventory, upgrades = rolling
    n1 = _register(inventory, "n1")
    upgrades.start(attrs.evolve(ORDER, url="", index_url="https://pypi.internal/simple/"))
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
            upgrades.start(attrs.evolve(ORDER, url="", sha256=""))

    async def test_a_wheel_and_an_index_together_are_refused(
        self, rolling: tuple[Inventory, Upgrades]
    ) -> None:
        inventory, upgrades = rolling
        _register(inventory, "n1")
        with pytest.raises(UpgradeRefused, match="from the wheel or from the package index, not both"):
            upgrades.start(attrs.evolve(ORDER, index_url="https://pypi.internal/simple/"))

    async def test_a_version_outside_the_window_is_refused_with_the_sentence_an_agent_would_get(
        self, rolling: tuple[Inventory, Upgrades]
    ) -> None:
        inventory, upgrades = rolling
        _register(inventory, "n1")
        with pytest.raises(UpgradeRefused, match=r"agent 0\.3\.0 is newer than this server accepts"):
            upgrades.start(attrs.evolve(ORDER, version="0.3.0"))

    async def test_a_node_never_registered_is_named(self, rolling: tuple[Inventory, Upgrades]) -> None:
        inventory, upgrades = rolling
        _register(inventory, "n1")
        with pytest.raises(UpgradeRefused, match="no node called n9"):
            upgrades.start(attrs.evolve(ORDER, nodes=("n1", "n9")))

    async def test_a_second_roll_while_one_runs_is_refused(self, rolling: tuple[Inventory, Upgrades]) -> None:
        inventory, upgrades = rolling
        _register(inventory, "n1")
        upgrades.start(ORDER)
        with pytest.raises(UpgradeRefused, match="under way"):
            upgrades.start(ORDER)

    async def test_a_dry_run_plans_without_asking_any_node(self, rolling: tuple[Inventory, Upgrades]) -> None:
        inventory, upgrades = rolling
        n1 = _register(inventory, "n1")
        _register(inventory, "n2", "0.2.0")
        gone = _register(inventory, "n3")
        inventory.detach(gone)

        view = upgrades.start(ORDER, dry_run=True)

        assert view.state == "planned"
        assert [(n.node, n.state) for n in view.nodes] == [
            ("n1", "waiting"),
            ("n2", "upgraded"),
            ("n3", "skipped"),
        ]
        assert _asked(n1) == []
