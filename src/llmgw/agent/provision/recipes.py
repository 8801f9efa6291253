"""Which build of an engine to install on which machine.

A recipe knows where an engine's builds are published and picks the one
that fits a host. vLLM and SGLang have none yet: they are Python
environments of several gigabytes, not an archive, and are installed by hand
and named in agent.yaml until they are.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import attrs

from llmgw.agent.discovery.host import Host
from llmgw.errors import LlmgwError


class UnsupportedError(LlmgwError):
    """No build of an engine fits this machine; the message says why."""


@attrs.frozen
class Build:
    """One published build of an engine, chosen for one machine."""

    # "cpu", "cuda-12.8".
    variant: str
    # Release assets, unpacked in order into one directory.
    assets: tuple[str, ...]
    # Binary file name, found anywhere in the unpacked tree.
    binary: str
    # OS packages the build links against that a minimal image may lack, by
    # packaging family: the same library is libgomp1 on one and libgomp on the other.
    packages: Mapping[str, tuple[str, ...]] = attrs.field(factory=dict)
    # Extensions the build is slow without: reported, never refused, since slow still runs.
    cpu_flags: tuple[str, ...] = ()


@attrs.frozen
class Recipe:
    # The GitHub repository whose releases carry the builds.
    repo: str
    # Picks the build for a version and a host, or raises UnsupportedError.
    choose: Callable[[str, Host], Build]


# The CUDA build taken on an x64 NVIDIA node. The release carries a matching
# cudart archive, so the node needs a driver and nothing else, no toolkit.
LLAMACPP_CUDA = "12.8"


def choose_llamacpp(version: str, host: Host) -> Build:
    # The Linux builds are made on Ubuntu, but nothing about them is Ubuntu's:
    # they need glibc 2.34 and GCC 12's libstdc++, which Debian 12 and RHEL 10
    # have and RHEL 9 does not. So the distribution's name decides nothing;
    # the build is tried everywhere and ldd says whether this system loads it.
    arch = {"amd64": "x64", "arm64": "arm64"}.get(host.arch)
    if arch is None:
        raise UnsupportedError(f"llama.cpp publishes no Linux build for {host.arch or 'this architecture'}")
    packages = {"deb": ("libgomp1",), "rpm": ("libgomp",)}
    if arch == "x64" and host.nvidia_driver:
        tail = f"bin-ubuntu-cuda-{LLAMACPP_CUDA}-x64.tar.gz"
        return Build(
            variant=f"cuda-{LLAMACPP_CUDA}",
            assets=(f"llama-{version}-{tail}", f"cudart-llama-{version}-{tail}"),
            binary="llama-server",
            packages=packages,
            cpu_flags=("avx2",),
        )
    # On arm64 the CUDA build is for a newer CUDA than a driver may support,
    # so an arm64 GPU node runs the CPU build until somebody decides otherwise.
    return Build(
        variant="cpu",
        assets=(f"llama-{version}-bin-ubuntu-{arch}.tar.gz",),
        binary="llama-server",
        packages=packages,
        # The archive carries a backend per CPU generation and loads the best
        # one, down to SSE4.2; below AVX2 it runs, several times slower.
        cpu_flags=("avx2",) if arch == "x64" else (),
    )


RECIPES: Mapping[str, Recipe] = {
    "llamacpp": Recipe(repo="ggml-org/llama.cpp", choose=choose_llamacpp),
}


def cannot_install(engine: str) -> str:
    return (
        f"this agent does not know how to install {engine}; "
        "install it by hand and name it in the agent's configuration"
    )
