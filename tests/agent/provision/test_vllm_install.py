"""vLLM as the agent installs it on this machine: once per machine, then recognised and rechecked.

The install itself fetches about 700 MB and makes a 3.5 GB environment, so it
happens once, under `${LLMGW_BUILD_CACHE:-~/.cache/llmgw}/engines`, through
the agent's own installer (tests/vllm_env.py, the fixture every test that runs
vLLM shares); this test then checks that an agent takes it as installed
without running pip again.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest

from llmgw.agent.discovery.host import Host
from llmgw.agent.provision.installer import READY, Installer, Want
from llmgw.agent.provision.release import ReleaseClient
from llmgw.agent.provision.runner import CommandResult, SubprocessRunner

from ...vllm_env import ENGINES, INSTALL_WITHIN_S, INSTALLED, VERSION


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
@pytest.mark.timeout(INSTALL_WITHIN_S + 600)
async def test_the_agent_recognises_and_rechecks_its_vllm_install_on_this_machine(vllm_python: Path) -> None:
    """vLLM 0.32.0 (cpu) installed by the agent is found by its marker and imported, not installed again."""
    runner = Counting()
    async with ReleaseClient() as releases:
        installer = Installer(ENGINES, Host(arch="amd64"), runner, releases)
        (st,) = await installer.converge([Want("vllm", VERSION)])

    assert st.state == READY, st.detail
    assert st.detail == f"vllm {VERSION}"
    assert st.binary == str(INSTALLED / "bin" / "python") == str(vllm_python)
    assert [c for c in runner.calls if "pip" in c or "venv" in c] == [], (
        "an installed vLLM was installed again"
    )
    assert [c[1] for c in runner.calls] == ["-c"], "vLLM was not rechecked by importing it"
