"""vLLM as the agent installs it on this machine: once per machine, then recognised and rechecked.

The install itself fetches about 700 MB and makes a 3.5 GB environment, so it
happens once, under `${LLMGW_BUILD_CACHE:-~/.cache/llmgw}/engines` (as
scripts/build-llama-server.sh caches llama-server), and only when
LLMGW_INSTALL_VLLM=1 asks for it; every later run finds it there and checks
that the agent takes it as installed without running pip again.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest

from llmgw.agent.discovery.host import Host
from llmgw.agent.provision.installer import READY, Installer, Source, Want
from llmgw.agent.provision.place import MARKER
from llmgw.agent.provision.release import ReleaseClient
from llmgw.agent.provision.runner import CommandResult, SubprocessRunner
from llmgw.agent.provision.wheels import WheelSource

VERSION = "0.32.0"
CACHE = Path(os.environ.get("LLMGW_BUILD_CACHE") or Path.home() / ".cache" / "llmgw") / "engines"
INSTALLED = CACHE / "vllm" / f"{VERSION}-cpu"


class Counting(SubprocessRunner):
    """The real runner, remembering what it ran."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, ...]] = []

    async def run(
        self, argv: Sequence[str], *, env: Mapping[str, str] | None = None, timeout_s: float | None = None
    ) -> CommandResult:
        self.calls.append(tuple(argv))
        return await super().run(argv, env=env, timeout_s=timeout_s)


@pytest.mark.slow
@pytest.mark.timeout(1800)
async def test_the_agent_recognises_and_rechecks_its_vllm_install_on_this_machine() -> None:
    """vLLM 0.32.0 (cpu) installed by the agent is found by its marker and imported, not installed again."""
    if not await asyncio.to_thread((INSTALLED / MARKER).is_file):
        if os.environ.get("LLMGW_INSTALL_VLLM") != "1":
            pytest.skip(
                f"no vLLM install under {CACHE}: LLMGW_INSTALL_VLLM=1 makes one (about 3 minutes, 3.5 GB)"
            )
        # pip's configured indexes and find-links serve torch's CPU build here; PyTorch's index is not
        # reachable from a test machine, so the registry alone is named.
        source = Source(wheels=WheelSource(index_url="https://pypi.org/simple"))
        async with ReleaseClient() as releases:
            first = Installer(CACHE, Host(arch="amd64"), SubprocessRunner(), releases)
            (st,) = await first.converge([Want("vllm", VERSION)], source)
        assert st.state == READY, st.detail
    runner = Counting()
    async with ReleaseClient() as releases:
        installer = Installer(CACHE, Host(arch="amd64"), runner, releases)
        (st,) = await installer.converge([Want("vllm", VERSION)])

    assert st.state == READY, st.detail
    assert st.detail == f"vllm {VERSION}"
    assert st.binary == str(INSTALLED / "bin" / "python")
    assert [c for c in runner.calls if "pip" in c or "venv" in c] == [], (
        "an installed vLLM was installed again"
    )
    assert [c[1] for c in runner.calls] == ["-c"], "vLLM was not rechecked by importing it"
