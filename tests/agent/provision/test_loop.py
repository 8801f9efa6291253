"""The agent's provision loop: when it passes, and what it reports."""

from __future__ import annotations

import asyncio
import sys
import venv
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from llmgw.agent.discovery.host import Host
from llmgw.agent.provision.installer import FAILED, READY
from llmgw.agent.provision.loop import ProvisionLoop
from llmgw.agent.provision.release import ReleaseClient
from llmgw.agent.provision.wheels import DEFAULT_INDEX
from llmgw.config import AgentConfig, EngineOptions, ProvisionConfig
from llmgw.engines.vllm import TORCH_CPU_INDEX
from llmgw.launcher import run as run_command
from llmgw.proto.llmgw import v1 as pb

from .test_wheels import FakeNode

HOST = Host(os_id="ubuntu", id_like=("debian",), arch="amd64", cpu_flags=("avx2",))


def provision(
    *engines: tuple[str, str], base_url: str = "", checksums: dict[str, str] | None = None
) -> pb.Provision:
    return pb.Provision(
        engines=[pb.EngineWant(engine=e, version=v) for e, v in engines],
        base_url=base_url,
        checksums=checksums or {},
    )


def agent_config(tmp_path: Path, engines: dict[str, EngineOptions] | None = None) -> AgentConfig:
    return AgentConfig(
        state_dir=str(tmp_path / "state"),
        engines=engines or {},
        provision=ProvisionConfig(dir=str(tmp_path / "engines")),
    )


async def until(check: Callable[[], bool], event: asyncio.Event, within_s: float = 30.0) -> None:
    """Wait on the loop's change event until check holds, or fail at the deadline."""
    async with asyncio.timeout(within_s):
        while not check():
            await event.wait()
            event.clear()


@pytest.fixture
def make_loop(tmp_path: Path, machine: Any, releases: ReleaseClient) -> Callable[..., ProvisionLoop]:
    def make(engines: dict[str, EngineOptions] | None = None, **kw: Any) -> ProvisionLoop:
        return ProvisionLoop(agent_config(tmp_path, engines), HOST, machine, releases, lock_retry_s=0.0, **kw)

    return make


@pytest.fixture
async def running() -> AsyncIterator[Callable[[ProvisionLoop], Awaitable[None]]]:
    async with asyncio.TaskGroup() as tg:
        tasks: list[asyncio.Task[None]] = []

        async def start(loop: ProvisionLoop) -> None:
            tasks.append(tg.create_task(loop.run()))

        yield start
        for task in tasks:
            task.cancel()


class TestPasses:
    async def test_a_provision_kicks_a_pass_and_its_outcome_is_reported(
        self, make_loop: Any, running: Any
    ) -> None:
        heard: list[None] = []
        loop = make_loop(on_change=lambda: heard.append(None))
        await running(loop)

        loop.kick(provision(("llamacpp", "b1")))
        await until(lambda: loop.engine_versions() == {"llamacpp": "b1"}, loop.changed)

        (st,) = loop.statuses()
        assert isinstance(st, pb.ProvisionStatus)
        assert (st.engine, st.version, st.variant, st.state) == ("llamacpp", "b1", "cpu", READY)
        assert st.detail == "llama-server version: 10991 (abc123)"
        assert loop.binaries()["llamacpp"].endswith("/llama-server")
        assert loop.probed
        assert heard, "nobody was told the statuses changed"

    async def test_nothing_is_installed_before_the_control_plane_says_what(
        self, make_loop: Any, release: Any
    ) -> None:
        loop = make_loop()
        await loop.probe_configured()

        assert loop.statuses() == [] and loop.engine_versions() == {}
        assert loop.probed, "an empty list must be an answer once probed"
        assert release.requests == []

    async def test_an_install_under_way_is_reported_before_it_finishes(
        self, make_loop: Any, running: Any, release: Any
    ) -> None:
        release.hold_downloads = asyncio.Event()
        loop = make_loop()
        await running(loop)

        loop.kick(provision(("llamacpp", "b1")))
        await until(lambda: any(s.detail.startswith("downloading ") for s in loop.statuses()), loop.changed)

        assert loop.statuses()[0].state == "installing"
        assert loop.engine_versions() == {}, "an engine still installing was reported as runnable"
        release.hold_downloads.set()
        await until(lambda: loop.engine_versions() == {"llamacpp": "b1"}, loop.changed)

    async def test_after_a_failure_the_next_pass_comes_after_a_minute_doubling_to_ten(
        self, make_loop: Any, release: Any
    ) -> None:
        loop = make_loop()
        loop.kick(provision(("llamacpp", "b404")))
        delays = []
        for _ in range(6):
            (st,) = await loop.run_pass()
            assert st.state == FAILED
            delays.append(loop.next_pass_s)

        assert delays == [60.0, 120.0, 240.0, 480.0, 600.0, 600.0]

        loop.kick(provision(("llamacpp", "b1")))
        await loop.run_pass()
        assert loop.next_pass_s == 600.0
        loop.kick(provision(("llamacpp", "b404")))
        await loop.run_pass()
        assert loop.next_pass_s == 60.0, "a success did not reset the backoff"

    async def test_a_failed_install_says_when_it_is_tried_again(self, make_loop: Any, release: Any) -> None:
        clock = [1000.0]
        loop = make_loop(clock=lambda: clock[0])
        loop.kick(provision(("llamacpp", "b404")))
        for _ in range(3):
            await loop.run_pass()
        clock[0] += 60

        (st,) = loop.statuses()
        assert (st.state, st.next_try_s) == (FAILED, 240 - 60)
        loop.kick(provision(("llamacpp", "b1")))
        await loop.run_pass()
        (st,) = loop.statuses()
        assert (st.state, st.next_try_s) == (READY, None), "a success kept a next try"

    async def test_a_failed_pass_is_reported_once_its_next_try_is_known(
        self, make_loop: Any, release: Any
    ) -> None:
        heard: list[None] = []
        loop = make_loop(on_change=lambda: heard.append(None))
        loop.kick(provision(("llamacpp", "b404")))
        await loop.run_pass()
        heard.clear()
        await loop.run_pass()
        assert heard, "the heartbeat never carried the next try"

    async def test_passes_repeat_on_their_own(self, make_loop: Any, running: Any, release: Any) -> None:
        """The ten-minute re-check, made short: a library removed later is found without a kick."""
        loop = make_loop(every_s=0.01)
        await running(loop)
        loop.kick(provision(("llamacpp", "b1")))

        async with asyncio.timeout(30):
            while loop.passes < 3:
                await loop.passed.wait()
                loop.passed.clear()

        assert len(release.downloads()) == 1

    async def test_an_engine_no_longer_wanted_is_no_longer_reported(self, make_loop: Any) -> None:
        loop = make_loop()
        loop.kick(provision(("llamacpp", "b1")))
        await loop.run_pass()
        assert loop.engine_versions() == {"llamacpp": "b1"}

        loop.kick(provision())

        assert loop.statuses() == [] and loop.engine_versions() == {}

    async def test_a_mirror_and_checksums_from_the_control_plane_are_used(
        self, make_loop: Any, release: Any, kit: Any
    ) -> None:
        loop = make_loop()
        release.api_status = 500
        loop.kick(
            provision(
                ("llamacpp", "b1"),
                base_url=f"{release.url}/mirror",
                checksums={kit.CPU_ASSET: "sha256:" + kit.sha256(release.assets[kit.CPU_ASSET])},
            )
        )

        (st,) = await loop.run_pass()

        assert st.state == READY, st.detail
        assert release.api_calls() == []


class TestWhatIsReported:
    async def test_an_engine_disabled_in_agent_yaml_is_never_installed_nor_reported(
        self, make_loop: Any, release: Any, tmp_path: Path
    ) -> None:
        binary = tmp_path / "llama-server"
        binary.write_text("#!/bin/sh\n")
        binary.chmod(0o755)
        loop = make_loop({"llamacpp": EngineOptions(binary=str(binary), disabled=True)})
        await loop.probe_configured()

        loop.kick(provision(("llamacpp", "b1")))
        results = await loop.run_pass()

        assert results == []
        assert release.requests == []
        assert loop.statuses() == [] and loop.engine_versions() == {}

    async def test_an_engine_whose_binary_agent_yaml_names_is_not_installed_and_is_reported(
        self, make_loop: Any, release: Any, tmp_path: Path
    ) -> None:
        """The operator's build wins: an installed one beside it would quietly replace theirs."""
        binary = tmp_path / "my-llama-server"
        binary.write_text("#!/bin/sh\nexit 1\n")
        binary.chmod(0o755)
        loop = make_loop({"llamacpp": EngineOptions(binary=str(binary))})
        await loop.probe_configured()

        loop.kick(provision(("llamacpp", "b1")))
        await loop.run_pass()

        assert release.requests == []
        assert loop.statuses() == []
        assert loop.engine_versions() == {"llamacpp": "unknown"}

    async def test_a_binary_agent_yaml_names_that_is_not_there_is_not_offered_and_says_why(
        self, make_loop: Any, tmp_path: Path
    ) -> None:
        missing = tmp_path / "missing" / "vllm"
        loop = make_loop({"vllm": EngineOptions(binary=str(missing))})
        await loop.probe_configured()

        assert loop.engine_versions() == {}
        (st,) = loop.statuses()
        assert (st.engine, st.state) == ("vllm", FAILED)
        assert st.detail == f"agent.yaml names {missing}, which is not an executable file here"

    async def test_an_engine_merely_found_on_path_is_not_reported(
        self, make_loop: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """A llama-server somebody once unpacked is not necessarily one that works."""
        bin_dir = tmp_path / "bin"
        bin_dir.mkdir()
        for name in ("llama-server", "vllm"):
            (bin_dir / name).write_text("#!/bin/sh\n")
            (bin_dir / name).chmod(0o755)
        monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
        loop = make_loop()
        await loop.probe_configured()

        assert loop.engine_versions() == {}

    async def test_the_sim_engine_is_never_installed(self, make_loop: Any, release: Any) -> None:
        loop = make_loop()
        loop.kick(provision(("sim", "1")))

        assert await loop.run_pass() == []
        assert release.requests == []


def python_with_sglang(root: Path) -> tuple[Path, Path]:
    """A throwaway venv whose sglang is a one-line package that counts its imports: (python, count file)."""
    venv.create(root, with_pip=False, symlinks=True)
    (site,) = root.glob("lib/python*/site-packages")
    imports = root / "imports"
    (site / "sglang").mkdir()
    (site / "sglang" / "__init__.py").write_text(
        f"with open({str(imports)!r}, 'a') as f:\n    f.write('imported\\n')\n__version__ = '0.5.2'\n"
    )
    return root / "bin" / "python", imports


class TestAnInterpreterAgentYamlNames:
    """SGLang is a module: its interpreter is there on every machine, so only an import says it is."""

    async def test_an_interpreter_that_cannot_import_sglang_is_reported_with_why(
        self, make_loop: Any, running: Any
    ) -> None:
        """The interpreter running these tests has no sglang; the node says so rather than offering it."""
        assert (await run_command([sys.executable, "-c", "import sglang"])).returncode != 0
        loop = make_loop({"sglang": EngineOptions(binary=sys.executable)})
        await running(loop)

        await until(lambda: loop.probed and bool(loop.statuses()), loop.changed)

        assert loop.engine_versions() == {}
        (st,) = loop.statuses()
        assert (st.engine, st.state) == ("sglang", FAILED)
        assert st.detail == (
            f"{sys.executable} cannot import sglang: ModuleNotFoundError: No module named 'sglang'"
        )

    async def test_an_interpreter_that_imports_sglang_offers_it_at_its_version(
        self, make_loop: Any, tmp_path: Path
    ) -> None:
        python, _ = await asyncio.to_thread(python_with_sglang, tmp_path / "sglang-env")
        loop = make_loop({"sglang": EngineOptions(binary=str(python))})

        await loop.probe_configured()

        assert loop.engine_versions() == {"sglang": "0.5.2"}
        assert loop.statuses() == []

    async def test_sglang_is_imported_once_however_often_the_control_plane_reconnects(
        self, make_loop: Any, running: Any, tmp_path: Path
    ) -> None:
        """Each reconnect sends a Provision, and each Provision a pass: the import is not paid again."""
        python, imports = await asyncio.to_thread(python_with_sglang, tmp_path / "sglang-env")
        loop = make_loop({"sglang": EngineOptions(binary=str(python))})
        await loop.probe_configured()  # the agent's own, before its first Register
        await running(loop)

        for passes in range(1, 4):
            loop.kick(provision(("llamacpp", "b1")))
            async with asyncio.timeout(30):
                while loop.passes < passes:
                    await loop.passed.wait()
                    loop.passed.clear()

        assert loop.engine_versions() == {"sglang": "0.5.2", "llamacpp": "b1"}
        assert imports.read_text().splitlines() == ["imported"]


class TestWhereWheelsComeFrom:
    """agent.yaml's index or wheelhouse for an engine reaches the pip that installs it."""

    async def test_a_sites_index_in_agent_yaml_is_the_one_pip_asks(
        self, tmp_path: Path, releases: ReleaseClient
    ) -> None:
        node = FakeNode()
        cfg = agent_config(tmp_path, {"vllm": EngineOptions(index_url="https://pypi.site/simple")})
        loop = ProvisionLoop(cfg, HOST, node, releases)
        loop.kick(provision(("vllm", "0.32.0")))

        (st,) = await loop.run_pass()

        assert st.state == READY, st.detail
        (pip,) = node.ran("pip", "install")
        assert pip[pip.index("--index-url") + 1] == "https://pypi.site/simple"
        assert "--extra-index-url" not in pip, "PyTorch's index was still asked"

    async def test_a_wheelhouse_in_agent_yaml_makes_pip_ask_no_index(
        self, tmp_path: Path, releases: ReleaseClient
    ) -> None:
        node = FakeNode()
        cfg = agent_config(tmp_path, {"vllm": EngineOptions(wheelhouse="/srv/wheels")})
        loop = ProvisionLoop(cfg, HOST, node, releases)
        loop.kick(provision(("vllm", "0.32.0")))

        (st,) = await loop.run_pass()

        assert st.state == READY, st.detail
        (pip,) = node.ran("pip", "install")
        assert pip[-3:] == ("--no-index", "--find-links", "/srv/wheels")
        assert "--index-url" not in pip

    async def test_an_engine_agent_yaml_says_nothing_of_is_installed_from_pypi_and_its_extra_indexes(
        self, tmp_path: Path, releases: ReleaseClient
    ) -> None:
        node = FakeNode()
        loop = ProvisionLoop(
            agent_config(tmp_path, {"llamacpp": EngineOptions(index_url="https://x/simple")}),
            HOST,
            node,
            releases,
        )
        loop.kick(provision(("vllm", "0.32.0")))

        await loop.run_pass()

        (pip,) = node.ran("pip", "install")
        assert pip[pip.index("--index-url") + 1] == DEFAULT_INDEX
        assert pip[pip.index("--extra-index-url") + 1] == TORCH_CPU_INDEX
