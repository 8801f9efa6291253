"""vLLM for the tests that run it, installed by the agent's own installer: one install path, never two.

The environment is the one an agent makes, `<cache>/engines/vllm/0.32.0-cpu`
with its marker, under `${LLMGW_BUILD_CACHE:-~/.cache/llmgw}` (an agent whose
engines directory is `<cache>/engines` finds it installed and only rechecks
it). Missing, it is installed for real: about 3 to 9 minutes and 3.4 GB, once
per machine. A separate install script once made a second, slightly
different environment, and a test passing on it said nothing of what a node
would run.

`index_url: https://pypi.org/simple` alone, not PyPI and PyTorch's index: a
test machine reaches PyPI (or its pip configuration's find-links, which hold
torch's CPU wheel here), and PyTorch's index, when unreachable, costs pip
about 8 s of retries per package.
"""

from __future__ import annotations

import asyncio
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from llmgw.agent.discovery.host import Host
from llmgw.agent.provision.installer import READY, Installer, InstallStatus, Source, Want
from llmgw.agent.provision.place import MARKER
from llmgw.agent.provision.release import ReleaseClient
from llmgw.agent.provision.runner import SubprocessRunner
from llmgw.agent.provision.wheels import WheelSource

VERSION = "0.32.0"
CACHE = Path(os.environ.get("LLMGW_BUILD_CACHE") or Path.home() / ".cache" / "llmgw")
# What agent.yaml's provision.dir names for an agent that is to find the tests' vLLM installed.
ENGINES = CACHE / "engines"
INSTALLED = ENGINES / "vllm" / f"{VERSION}-cpu"
INDEX = "https://pypi.org/simple"
# The most an install may take on a slow, shared machine before the test says it is stuck.
INSTALL_WITHIN_S = 1800


async def _install() -> InstallStatus:
    source = Source(wheels=WheelSource(index_url=INDEX))
    async with ReleaseClient() as releases:
        installer = Installer(ENGINES, Host(arch="amd64"), SubprocessRunner(), releases)
        (st,) = await installer.converge([Want("vllm", VERSION)], source)
    return st


def install_vllm() -> Path:
    """The vLLM environment's interpreter, installed by the agent's installer when it is not there."""
    ENGINES.mkdir(parents=True, exist_ok=True)
    # Two test runs sharing the cache must not both spend minutes on the same directory: the second
    # waits for the first, then finds its marker.
    with (ENGINES / ".vllm-install.lock").open("w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        if not (INSTALLED / MARKER).is_file():
            st = asyncio.run(_install())
            if st.state != READY:
                pytest.fail(
                    f"the agent's installer could not install vLLM {VERSION}: {st.detail}", pytrace=False
                )
    return INSTALLED / "bin" / "python"


@pytest.fixture(scope="session")
def vllm_python() -> Iterator[Path]:
    """The interpreter of the agent-made vLLM environment (`<dir>/bin/python`), installed when missing."""
    yield install_vllm()
