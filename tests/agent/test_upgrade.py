"""An agent carrying out an Upgrade: the digest first, then the trial of the agent it restarts into."""

from __future__ import annotations

import asyncio
import hashlib
import os
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import attrs
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from llmgw.agent import trial
from llmgw.agent.upgrade import Upgrader, not_downloaded
from llmgw.launcher import CommandResult
from llmgw.proto.llmgw import v1 as pb

from ..waiting import eventually
from ..wheel import build_wheel


async def _upgrader(state_dir: Path, version: str = "0.1.0") -> tuple[Upgrader, list[str]]:
    left: list[str] = []
    marker, on_trial = await asyncio.to_thread(trial.settle, state_dir, version)
    upgrader = Upgrader(
        state_dir, marker, on_trial=on_trial, leave_engines=lambda: left.append("left"), version=version
    )
    return upgrader, left


_UNDER_WAY = ("installing", trial.TRIAL)


async def _until_settled(
    upgrader: Upgrader, connected: asyncio.Event, within_s: float = 10.0
) -> pb.UpgradeStatus:
    task = asyncio.create_task(upgrader.run(connected))
    try:
        await eventually(
            lambda: (s := upgrader.status()) is not None and s.state not in ("installing", trial.TRIAL),
            within_s,
        )
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    status = upgrader.status()
    assert status is not None
    return status


async def test_a_wheel_whose_digest_does_not_match_is_refused_with_nothing_changed(tmp_path: Path) -> None:
    wheel = tmp_path / "llmgw-0.2.0-py3-none-any.whl"
    await asyncio.to_thread(wheel.write_bytes, b"not the release")
    state_dir = tmp_path / "state"
    upgrader, left = await _upgrader(state_dir)
    upgrader.ask(pb.Upgrade(version="0.2.0", url=str(wheel), sha256="0" * 64))

    status = await _until_settled(upgrader, asyncio.Event())

    assert status.state == "refused"
    digest = hashlib.sha256(b"not the release").hexdigest()
    assert status.detail == (
        f"llmgw-0.2.0-py3-none-any.whl has sha256 {digest}, not the {'0' * 64} the control plane holds "
        "for 0.2.0: refused, nothing changed"
    )
    assert upgrader.restart is None and left == []
    assert not await asyncio.to_thread((state_dir / "versions" / "0.2.0").exists)
    # Nothing on trial: the marker only keeps the refusal, to be said again.
    marker = await asyncio.to_thread(trial.read, state_dir)
    assert marker is not None and (marker.state, marker.previous) == (trial.REFUSED, [])


async def test_a_refusal_is_said_again_by_the_agent_after_it_restarts(tmp_path: Path) -> None:
    """Held in memory alone, it vanished from `ctl nodes` at the agent's next start."""
    wheel = tmp_path / "llmgw-0.2.0-py3-none-any.whl"
    await asyncio.to_thread(wheel.write_bytes, b"not the release")
    state_dir = tmp_path / "state"
    upgrader, _ = await _upgrader(state_dir)
    upgrader.ask(pb.Upgrade(version="0.2.0", url=str(wheel), sha256="0" * 64))
    refused = await _until_settled(upgrader, asyncio.Event())

    restarted, _ = await _upgrader(state_dir)

    assert restarted.status() == refused
    assert refused.state == "refused" and refused.from_version == "0.1.0"


async def test_a_release_that_is_not_a_wheel_is_refused(tmp_path: Path) -> None:
    upgrader, _ = await _upgrader(tmp_path)
    upgrader.ask(pb.Upgrade(version="0.2.0", url="https://mirror/llmgw-0.2.0.tar.gz", sha256="0" * 64))
    status = await _until_settled(upgrader, asyncio.Event())
    assert status.state == "refused"
    assert status.detail == "https://mirror/llmgw-0.2.0.tar.gz is not a wheel (a .whl file)"


class TestTheTrial:
    async def test_the_new_agent_commits_once_it_registers_and_current_points_at_it(
        self, tmp_path: Path
    ) -> None:
        await asyncio.to_thread(
            trial.write, tmp_path, trial.Marker("0.2.0", "0.1.0", trial.TRIAL, started=1.0)
        )
        upgrader, _ = await _upgrader(tmp_path, "0.2.0")
        connected = asyncio.Event()
        connected.set()

        status = await _until_settled(upgrader, connected)

        assert status.state == "upgraded" and status.detail.startswith("upgraded from 0.1.0 in ")
        current = await asyncio.to_thread((tmp_path / "versions" / "current").readlink)
        assert current == Path("0.2.0")
        marker = await asyncio.to_thread(trial.read, tmp_path)
        assert marker is not None and marker.state == trial.UPGRADED
        assert upgrader.restart is None

    async def test_a_new_agent_that_does_not_register_in_time_goes_back_to_the_previous_command(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        monkeypatch.setenv("PYTHONPATH", "/srv/new")
        previous = ["/opt/llmgw/bin/python", "-m", "llmgw", "--role=agent"]
        marker = trial.Marker(
            "0.2.0", "0.1.0", trial.TRIAL, previous=previous, previous_pythonpath="/srv/old", trial_s=0.01
        )
        await asyncio.to_thread(trial.write, tmp_path, marker)
        upgrader, left = await _upgrader(tmp_path, "0.2.0")
        task = asyncio.create_task(upgrader.run(asyncio.Event()))

        await asyncio.wait_for(upgrader.restart_wanted.wait(), 10)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

        assert upgrader.restart is not None
        assert upgrader.restart.argv == previous
        assert upgrader.restart.env["PYTHONPATH"] == "/srv/old"
        assert left == ["left"]
        gone = await asyncio.to_thread(trial.read, tmp_path)
        assert gone is not None and gone.state == trial.ROLLED_BACK
        assert gone.detail == "the agent of 0.2.0 did not register with the control plane within 0.01 s"


async def test_a_wheel_fetched_over_http_is_checked_against_the_digest_too(tmp_path: Path) -> None:
    async def wheel(request: web.Request) -> web.Response:
        return web.Response(body=b"a release from the mirror")

    app = web.Application()
    app.router.add_get("/wheels/llmgw-0.2.0-py3-none-any.whl", wheel)
    upgrader, _ = await _upgrader(tmp_path)
    async with TestServer(app) as server:
        url = str(server.make_url("/wheels/llmgw-0.2.0-py3-none-any.whl"))
        upgrader.ask(pb.Upgrade(version="0.2.0", url=url, sha256="1" * 64))
        status = await _until_settled(upgrader, asyncio.Event())
    digest = hashlib.sha256(b"a release from the mirror").hexdigest()
    assert status.state == "refused"
    assert f"has sha256 {digest}, not the {'1' * 64}" in status.detail


@attrs.frozen
class Index:
    """A package index on loopback with one release of llmgw, and what pip asked it for."""

    url: str
    wheel: Path
    asked: list[str]

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.wheel.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def release(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """This tree as llmgw 0.2.0's wheel."""

    def at_0_2_0(package: Path) -> None:
        init = package / "__init__.py"
        init.write_text(init.read_text().replace('__version__ = "', '__version__ = "0.2.0"  # was "', 1))

    where = tmp_path_factory.mktemp("release")
    build_wheel(where / "wheels", where / "tree", at_0_2_0)
    return where / "wheels" / "llmgw-0.2.0-py3-none-any.whl"


@pytest.fixture
def only_this_index(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """pip as on a node that is configured with nothing: this machine's indexes and wheelhouse are out."""
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    for name in ("PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "PIP_FIND_LINKS", "PIP_NO_INDEX", "PIP_CONSTRAINT"):
        monkeypatch.delenv(name, raising=False)
    yield


@pytest.fixture
async def index(release: Path, only_this_index: None) -> AsyncIterator[Index]:
    """A PEP 503 simple index serving llmgw 0.2.0's wheel and nothing else."""
    body = await asyncio.to_thread(release.read_bytes)
    digest = hashlib.sha256(body).hexdigest()
    asked: list[str] = []

    async def project(request: web.Request) -> web.Response:
        asked.append(request.path)
        if request.match_info["name"] != "llmgw":
            raise web.HTTPNotFound()
        link = f'<a href="/files/{release.name}#sha256={digest}">{release.name}</a>'
        return web.Response(text=f"<!DOCTYPE html><html><body>{link}</body></html>", content_type="text/html")

    async def wheel(request: web.Request) -> web.Response:
        asked.append(request.path)
        return web.Response(body=body, content_type="application/octet-stream")

    app = web.Application()
    app.router.add_get("/simple/{name}/", project)
    app.router.add_get(f"/files/{release.name}", wheel)
    async with TestServer(app, host="127.0.0.1") as server:
        yield Index(str(server.make_url("/simple/")), release, asked)


async def _leftovers(state_dir: Path) -> list[str]:
    """What an upgrade left under state_dir/versions."""
    versions = state_dir / "versions"
    found = await asyncio.to_thread(lambda: sorted(versions.rglob("*")) if versions.exists() else [])
    return [str(p.relative_to(versions)) for p in found]


class TestFromThePackageIndex:
    @pytest.mark.timeout(300)
    async def test_the_wheel_comes_from_the_index_the_nodes_pip_is_configured_with_and_is_installed(
        self, index: Index, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        monkeypatch.setenv("PIP_INDEX_URL", index.url)
        upgrader, left = await _upgrader(tmp_path)
        upgrader.ask(pb.Upgrade(version="0.2.0", sha256=index.sha256))

        status = await _until_settled(upgrader, asyncio.Event(), within_s=240)

        assert status.state == "restarting", status.detail
        # Its dependencies are the running environment's: the index was asked for llmgw alone.
        assert set(index.asked) == {"/simple/llmgw/", f"/files/{index.wheel.name}"}
        python = tmp_path / "versions" / "0.2.0" / "bin" / "python"
        assert upgrader.restart is not None and upgrader.restart.argv[0] == str(python)
        assert left == ["left"]
        said = await asyncio.create_subprocess_exec(
            str(python),
            "-c",
            "import importlib.metadata as m; print(m.version('llmgw'))",
            env={**os.environ, "PYTHONPATH": ""},
            stdout=asyncio.subprocess.PIPE,
        )
        out, _ = await said.communicate()
        assert out.decode().strip() == "0.2.0"
        marker = await asyncio.to_thread(trial.read, tmp_path)
        assert marker is not None and (marker.to, marker.state) == ("0.2.0", trial.TRIAL)
        assert "incoming" not in await _leftovers(tmp_path)

    async def test_a_wheel_from_the_index_whose_digest_does_not_match_is_refused_with_nothing_changed(
        self, index: Index, tmp_path: Path
    ) -> None:
        upgrader, left = await _upgrader(tmp_path)
        upgrader.ask(pb.Upgrade(version="0.2.0", sha256="0" * 64, index_url=index.url))

        status = await _until_settled(upgrader, asyncio.Event(), within_s=120)

        assert status.state == "refused"
        assert status.detail == (
            f"{index.wheel.name} has sha256 {index.sha256}, not the {'0' * 64} the control plane holds "
            "for 0.2.0: refused, nothing changed"
        )
        assert upgrader.restart is None and left == []
        marker = await asyncio.to_thread(trial.read, tmp_path)
        assert marker is not None and marker.state == trial.REFUSED
        assert await _leftovers(tmp_path) == []

    async def test_a_version_the_index_does_not_have_is_refused_in_words_with_nothing_left(
        self, index: Index, tmp_path: Path
    ) -> None:
        upgrader, left = await _upgrader(tmp_path)
        upgrader.ask(pb.Upgrade(version="0.3.0", sha256="0" * 64, index_url=index.url))

        status = await _until_settled(upgrader, asyncio.Event(), within_s=120)

        assert status.state == "refused"
        assert status.detail == (
            "the package index has no llmgw 0.3.0: ERROR: No matching distribution found for llmgw==0.3.0"
        )
        assert "/simple/llmgw/" in index.asked
        assert upgrader.restart is None and left == []
        assert await _leftovers(tmp_path) == []


def test_an_index_pip_ignores_for_being_served_over_http_is_named_with_how_to_trust_it() -> None:
    """What pip 26 prints for an http index on another machine, and says no more of after."""
    said = (
        "Looking in indexes: http://198.18.0.1:8082/simple/\n"
        "WARNING: The repository located at 198.18.0.1 is not a trusted or secure host and is being "
        "ignored. If this repository is available via HTTPS we recommend you use HTTPS instead, otherwise "
        "you may silence this warning and allow it anyway with '--trusted-host 198.18.0.1'.\n"
        "ERROR: Could not find a version that satisfies the requirement llmgw==0.2.0 (from versions: none)\n"
        "ERROR: No matching distribution found for llmgw==0.2.0\n"
    )
    assert not_downloaded("0.2.0", CommandResult(1, said)) == (
        "cannot fetch llmgw 0.2.0: pip ignores the package index at 198.18.0.1, served over http: trust it "
        "in the node's pip configuration (pip config set global.trusted-host 198.18.0.1), or serve it over "
        "https"
    )


def test_a_download_that_never_finishes_is_not_called_a_missing_version() -> None:
    said = CommandResult(-1, "WARNING: Retrying (Retry(total=4)) after connection broken\n", timed_out=True)
    assert not_downloaded("0.2.0", said) == (
        "cannot fetch llmgw 0.2.0: pip download did not finish within 600 s "
        "(it last said: WARNING: Retrying (Retry(total=4)) after connection broken)"
    )
