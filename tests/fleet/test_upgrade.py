"""`llmgw ctl upgrade` on a fleet: agents restart into a new release and keep their engines.

A control plane and three nodes, two replicas of the sim, about 20 requests a second through the
gateway from the control plane's host. The agents run this tree; the release they are rolled to
is a wheel of this same tree with a higher version, built here, installed by each node into an
environment of its own (docs/operations.md, "Upgrading"): named by path, or fetched from a package
index served from the control plane's host.
"""

from __future__ import annotations

import hashlib
import json
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import pytest

from llmgw.agent import state as engine_state

from ..wheel import build_wheel
from .cluster import MIRROR_PORT, Fleet, http, log_events
from .netns import Host, Network, wait_until
from .traffic import Traffic

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

NODES = ("n1", "n2", "n3")
SIM = {"name": "sim-chat", "replicas": 2, "profiles": [{"engine": "sim"}]}
# A grace longer than an agent's restart: the node's replicas stay routed while it is away.
CONTROL = {"interval_s": 0.5, "grace_s": 15.0, "base_backoff_s": 1.0}
ROLL_S = 300.0
# The package index on the control plane's host, beside the mirror's port: the namespace is this test's.
INDEX_PORT = MIRROR_PORT + 1


@attrs.frozen
class Wheel:
    version: str
    path: Path

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.path.read_bytes()).hexdigest()


# Appended to a module of a release that must fail: its command line cannot be imported, or its
# agent starts and never registers.
_BREAKS = {
    "import": ("cli/main.py", 'raise ImportError("this build is broken")'),
    "register": (
        "agent/client.py",
        "async def _silent(self): await asyncio.Event().wait()\nAgentClient.run = _silent",
    ),
}


def _build(version: str, into: Path, broken: str = "") -> Wheel:
    """A wheel of this tree at version; broken: how it fails (_BREAKS), when it does."""

    def change(package: Path) -> None:
        init = package / "__init__.py"
        init.write_text(init.read_text().replace('__version__ = "', f'__version__ = "{version}"  # was "', 1))
        if broken:
            module, text = _BREAKS[broken]
            path = package / module
            path.write_text(path.read_text() + f"\n{text}\n")

    out = into / "wheels"
    build_wheel(out, into / f"tree-{version}", change)
    return Wheel(version, out / f"llmgw-{version}-py3-none-any.whl")


@pytest.fixture(scope="module")
def wheels(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Wheel]:
    """new: this tree at 0.2.0; import and register: this tree at 0.1.1 and 0.1.2, broken so (_BREAKS)."""
    where = tmp_path_factory.mktemp("releases")
    return {
        "new": _build("0.2.0", where),
        "import": _build("0.1.1", where, broken="import"),
        "register": _build("0.1.2", where, broken="register"),
    }


@pytest.fixture(scope="module")
def n3(network: Network) -> Iterator[Host]:
    """A third node host, removed after the module."""
    try:
        yield network.add_host("n3", 13)
    finally:
        network.remove_host("n3")


def _engine_pids(fleet: Fleet) -> dict[str, int]:
    """Shard id -> its engine's pid, from each node's state file (agent/state.py)."""
    return {
        record.request.shard_id: record.pid
        for node in NODES
        for record in engine_state.read_state(fleet.workdir / node)
    }


def _upgrade(fleet: Fleet, wheel: Wheel, sha256: str | None = None, **more: Any) -> dict[str, Any]:
    """Ask for a roll as `llmgw ctl upgrade` does, and wait for it to end; its last view."""
    order = {"version": wheel.version, "url": str(wheel.path), "sha256": sha256 or wheel.sha256, **more}
    reply = fleet.cp.call(
        http,
        "POST",
        f"{fleet.gateway}/admin/api/v1/upgrades",
        order,
        {"Authorization": f"Bearer {fleet.admin_token}"},
    )
    assert reply.status == 202, f"{reply.status} {reply.body}"
    roll: dict[str, Any] = wait_until(
        lambda: (view := fleet.admin("upgrades"))["state"] != "running" and view,
        ROLL_S,
        f"the roll to {wheel.version} to end",
        every_s=0.5,
    )
    print(json.dumps(roll, indent=1))
    return roll


def test_agents_rolled_to_a_new_release_keep_their_engines_and_every_request(
    fleet: Fleet, n3: Host, wheels: dict[str, Wheel]
) -> None:
    fleet.start(list(NODES), [SIM], server={"control": CONTROL})
    engines = _engine_pids(fleet)
    agents = {node: fleet.agents[node].pid for node in NODES}
    assert len(engines) == 2
    traffic = Traffic(fleet.cp, [fleet.gateway], "sim-chat", fleet.key)
    traffic.start()
    traffic.wait_for(20)

    began = time.monotonic()
    roll = _upgrade(fleet, wheels["new"])
    ended = time.monotonic()
    traffic.wait_for(20)
    traffic.stop()
    during = [status for at, status in traffic.outcomes if began <= at <= ended]
    # The figures docs/operations.md ("Upgrading") gives: read with `pytest -s`.
    print(f"during the roll: {len(during)} requests, {sum(s != 200 for s in during)} failed")

    assert roll["state"] == "done", roll
    assert [n["state"] for n in roll["nodes"]] == ["upgraded"] * 3
    assert traffic.failed() == [], f"{len(traffic.failed())} of {len(traffic.outcomes)} failed"
    nodes = fleet.nodes()
    for node in NODES:
        assert nodes[node]["agent_version"] == "0.2.0"
        assert nodes[node]["connected"]
        assert nodes[node]["upgrade"]["state"] == "upgraded", nodes[node]["upgrade"]
        # The same process: exec keeps the pid, and the engines stay its children.
        assert fleet.agents[node].alive() and fleet.agents[node].pid == agents[node]
        # Its command line names the release, the role and the config, for `ps` and `pgrep -f`.
        argv = _argv(agents[node])
        assert argv[1].endswith("/versions/0.2.0/bin/llmgw-trial") and "--role=agent" in argv, argv
        assert argv[argv.index("--config") + 1].endswith(f"/{node}.yaml"), argv
    assert _engine_pids(fleet) == engines
    assert fleet.routed("sim-chat") == 2

    # As systemd would after a crash: SIGKILL, and the unit's own command, the release before.
    fleet.agents["n1"].signal_group(signal.SIGKILL)
    fleet.agents["n1"].popen.wait(10)
    restarted = fleet.restart_agent(fleet.network.hosts["n1"])
    wait_until(
        lambda: (n1 := fleet.nodes()["n1"])["connected"] and n1["agent_version"] == "0.2.0",
        60,
        "the restarted agent to come back on 0.2.0",
    )
    said = [e["event"] for e in log_events(restarted) if e.get("event", "").startswith("running llmgw")]
    environment = (fleet.workdir / "n1" / "versions" / "0.2.0").resolve()
    assert said == [
        f"running llmgw 0.2.0 from {environment}, the release this node was upgraded to; "
        "python -m llmgw is 0.1.0"
    ], said
    assert restarted.alive()
    assert _argv(restarted.pid)[1].endswith("/versions/0.2.0/bin/llmgw-current")
    assert _engine_pids(fleet) == engines


def test_a_release_whose_digest_does_not_match_is_refused_on_every_node_with_nothing_changed(
    fleet: Fleet, n3: Host, wheels: dict[str, Wheel]
) -> None:
    fleet.start(list(NODES), [SIM], server={"control": CONTROL})
    engines = _engine_pids(fleet)

    roll = _upgrade(fleet, wheels["new"], sha256="0" * 64, max_unavailable=3)

    assert roll["state"] == "stopped", roll
    for step in roll["nodes"]:
        assert step["state"] == "refused", step
        assert "sha256" in step["detail"] and "nothing changed" in step["detail"], step
    nodes = fleet.nodes()
    for node in NODES:
        assert nodes[node]["agent_version"] == "0.1.0"
        assert nodes[node]["upgrade"]["state"] == "refused"
        assert not (fleet.workdir / node / "versions" / "0.2.0").exists()
        said = [e for e in log_events(fleet.agents[node]) if e.get("event") == "refused an upgrade"]
        assert said and "sha256" in said[0]["why"], f"{node} did not say why"
    assert _engine_pids(fleet) == engines


def _argv(pid: int) -> list[str]:
    """The command line of the process pid, as `ps` and `pgrep -f` read it."""
    return Path(f"/proc/{pid}/cmdline").read_bytes().decode().rstrip("\0").split("\0")


def _serve_index(fleet: Fleet, wheel: Wheel) -> str:
    """A PEP 503 page for llmgw with wheel and nothing else, served from the control plane's host; its URL.

    Static files behind `python -m http.server`: an index is no more than that to pip.
    """
    project = fleet.workdir / "index" / "simple" / "llmgw"
    project.mkdir(parents=True)
    (project / wheel.path.name).write_bytes(wheel.path.read_bytes())
    link = f'<a href="{wheel.path.name}#sha256={wheel.sha256}">{wheel.path.name}</a>'
    (project / "index.html").write_text(f"<!DOCTYPE html><html><body>{link}</body></html>\n")
    argv = [sys.executable, "-m", "http.server", str(INDEX_PORT), "--bind", fleet.cp.address]
    server = fleet.cp.run(
        [*argv, "--directory", str(fleet.workdir / "index")],
        fleet.workdir / "logs" / "index.log",
        name="index",
    )
    url = f"http://{fleet.cp.address}:{INDEX_PORT}/simple/"
    wait_until(
        lambda: fleet.cp.call(http, "GET", f"{url}llmgw/").status == 200 or not server.alive(),
        30,
        "the package index to answer",
    )
    assert server.alive(), f"the package index exited:\n{server.output()}"
    return url


def test_an_agent_rolled_to_a_release_from_the_package_index_fetches_it_there_and_keeps_its_engines(
    fleet: Fleet, n3: Host, wheels: dict[str, Wheel], monkeypatch: pytest.MonkeyPatch
) -> None:
    # The nodes' pip configuration: pip ignores an index served over http unless it is trusted.
    monkeypatch.setenv("PIP_TRUSTED_HOST", fleet.cp.address)
    fleet.start(list(NODES), [SIM], server={"control": CONTROL})
    engines = _engine_pids(fleet)
    index = _serve_index(fleet, wheels["new"])

    roll = _upgrade(fleet, wheels["new"], url="", index_url=index, nodes=["n1"])

    assert roll["state"] == "done", roll
    n1 = fleet.nodes()["n1"]
    assert n1["agent_version"] == "0.2.0" and n1["connected"], n1
    assert n1["upgrade"]["state"] == "upgraded", n1["upgrade"]
    assert _engine_pids(fleet) == engines
    # From the index, by n1: http.server logs each request with the address it came from.
    served = (fleet.workdir / "logs" / "index.log").read_text()
    n1_address = fleet.network.hosts["n1"].address
    assert f"{n1_address} - - " in served and f'"GET /simple/llmgw/{wheels["new"].path.name} ' in served, (
        served
    )
    assert not (fleet.workdir / "n1" / "versions" / "incoming").exists()


# What each broken release says as it goes back.
_WHY = {
    "import": "the new agent cannot start: ImportError: this build is broken",
    "register": "did not register with the control plane within 5 s",
}


@pytest.mark.parametrize("broken", ["import", "register"])
def test_an_agent_that_cannot_start_the_new_release_goes_back_on_its_own_and_stops_the_roll(
    fleet: Fleet, n3: Host, wheels: dict[str, Wheel], broken: str
) -> None:
    """A release that cannot be imported, and one that starts but never registers (within --trial-s)."""
    fleet.start(list(NODES), [SIM], server={"control": CONTROL})
    engines = _engine_pids(fleet)
    agent = fleet.agents["n1"].pid

    roll = _upgrade(fleet, wheels[broken], nodes=["n1", "n2"], trial_s=5)

    assert roll["state"] == "stopped", roll
    first, second = roll["nodes"]
    assert first["state"] == "rolled back", first
    assert _WHY[broken] in first["detail"], first
    assert second["state"] == "skipped"
    assert "n1" in roll["detail"]
    fleet.wait_connected("n1")
    n1 = fleet.nodes()["n1"]
    assert n1["agent_version"] == "0.1.0"
    assert n1["upgrade"]["state"] == "rolled back"
    assert fleet.agents["n1"].alive() and fleet.agents["n1"].pid == agent
    assert _engine_pids(fleet) == engines
