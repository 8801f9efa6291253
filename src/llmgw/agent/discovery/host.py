"""What the machine is, as far as installing an engine on it is concerned.

Read from files the kernel and the distribution keep, with every path a
parameter so a test can describe a machine it is not running on. Reading is
plain blocking file work; the agent calls `discover_host`, which does it in a
thread.
"""

from __future__ import annotations

import asyncio
import platform
import re
from pathlib import Path

import attrs

from llmgw.proto.llmgw import v1 as pb

OS_RELEASE = Path("/etc/os-release")
CPUINFO = Path("/proc/cpuinfo")
NVIDIA_VERSION = Path("/proc/driver/nvidia/version")

# The extensions that decide how fast an engine runs here. A VM given QEMU's
# default CPU model has none of them, and runs several times slower with
# nothing else looking wrong.
INTERESTING_CPU_FLAGS = ("avx", "avx2", "fma", "f16c", "avx512f", "avx512_bf16", "amx_tile", "asimd", "sve")

# Package names and release archives are keyed by Debian's spelling of the
# architecture, not the kernel's.
_DEBIAN_ARCH = {
    "x86_64": "amd64",
    "amd64": "amd64",
    "aarch64": "arm64",
    "arm64": "arm64",
    "armv7l": "armhf",
    "armv6l": "armel",
    "i386": "i386",
    "i686": "i386",
    "ppc64le": "ppc64el",
}

# ID and ID_LIKE values by packaging family. ID_LIKE decides rather than a
# list of distributions, so a derivative nobody listed still finds its tool.
_DEB_IDS = frozenset({"debian", "ubuntu"})
_RPM_IDS = frozenset(
    {"rhel", "fedora", "centos", "rocky", "almalinux", "ol", "amzn", "suse", "opensuse", "sles"}
)

_DRIVER_VERSION = re.compile(r"Kernel Module\b.*?\s(\d+\.\d+(?:\.\d+)*)\b")

NO_AVX2_WARNING = 'no AVX2: inference runs several times slower (a VM needs CPU type "host")'


@attrs.frozen
class Host:
    """One machine: its distribution, architecture, vector extensions and NVIDIA driver."""

    os_id: str = ""
    os_version: str = ""
    os_codename: str = ""
    # ID_LIKE: "debian" for Ubuntu, "rhel centos fedora" for Rocky.
    id_like: tuple[str, ...] = ()
    arch: str = ""
    cpu_flags: tuple[str, ...] = ()
    # The loaded kernel module's version; empty when no driver is loaded.
    nvidia_driver: str = ""

    @property
    def family(self) -> str:
        """The packaging family, "deb" or "rpm", or "" when neither is known."""
        return family_of(self.os_id, self.id_like)

    def has_cpu_flag(self, flag: str) -> bool:
        return flag in self.cpu_flags

    def warnings(self) -> list[str]:
        """What about this machine an operator should know, in their words."""
        if self.arch == "amd64" and not self.has_cpu_flag("avx2"):
            return [NO_AVX2_WARNING]
        return []

    def to_proto(self) -> pb.Host:
        return pb.Host(
            os_id=self.os_id,
            os_version=self.os_version,
            os_codename=self.os_codename,
            arch=self.arch,
            cpu_flags=list(self.cpu_flags),
            nvidia_driver=self.nvidia_driver,
            family=self.family,
            id_like=list(self.id_like),
        )

    def describe(self) -> str:
        """One line for the agent's start-up log: "ubuntu 24.04 amd64, NVIDIA 570.86.15"."""
        text = " ".join(p for p in (self.os_id or "unknown OS", self.os_version, self.arch) if p)
        if self.nvidia_driver:
            text += f", NVIDIA {self.nvidia_driver}"
        return text


def family_of(os_id: str, id_like: tuple[str, ...] | list[str]) -> str:
    for name in (os_id, *id_like):
        if name in _DEB_IDS:
            return "deb"
        if name in _RPM_IDS:
            return "rpm"
    return ""


def debian_arch(machine: str) -> str:
    """Debian's name for a kernel's machine string: x86_64 is amd64, aarch64 is arm64."""
    return _DEBIAN_ARCH.get(machine, machine)


def read_host(
    os_release: Path = OS_RELEASE,
    cpuinfo: Path = CPUINFO,
    nvidia_version: Path = NVIDIA_VERSION,
    machine: str | None = None,
) -> Host:
    """Read what the machine is; blocking, so the agent calls it through `discover_host`."""
    fields = _read_os_release(os_release)
    return Host(
        os_id=fields.get("ID", ""),
        os_version=fields.get("VERSION_ID", ""),
        os_codename=fields.get("VERSION_CODENAME", ""),
        id_like=tuple(fields.get("ID_LIKE", "").split()),
        arch=debian_arch(machine if machine is not None else platform.machine()),
        cpu_flags=_read_cpu_flags(cpuinfo),
        nvidia_driver=_read_nvidia_driver(nvidia_version),
    )


async def discover_host(
    os_release: Path = OS_RELEASE,
    cpuinfo: Path = CPUINFO,
    nvidia_version: Path = NVIDIA_VERSION,
    machine: str | None = None,
) -> Host:
    """`read_host` in a thread, for the agent's start."""
    return await asyncio.to_thread(read_host, os_release, cpuinfo, nvidia_version, machine)


def _read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""


def _read_os_release(path: Path) -> dict[str, str]:
    out: dict[str, str] = {}
    for line in _read_text(path).splitlines():
        key, sep, value = line.strip().partition("=")
        if not sep or key.startswith("#"):
            continue
        out[key] = value.strip().strip("\"'")
    return out


def _read_cpu_flags(path: Path) -> tuple[str, ...]:
    have: set[str] = set()
    for line in _read_text(path).splitlines():
        key, sep, value = line.partition(":")
        # "flags" on x86, "Features" on ARM. The first processor is enough:
        # a machine does not mix instruction sets across its cores.
        if sep and key.strip() in ("flags", "Features"):
            have = set(value.split())
            break
    return tuple(f for f in INTERESTING_CPU_FLAGS if f in have)


def _read_nvidia_driver(path: Path) -> str:
    # The kernel module's own file exists exactly when a driver is loaded,
    # unlike nvidia-smi, which can be installed where the module failed to load.
    # "NVRM version: NVIDIA UNIX x86_64 Kernel Module  570.86.15  Thu ...", or
    # for the open module "... Open Kernel Module for x86_64  570.86.15  Release Build ...".
    found = _DRIVER_VERSION.search(_read_text(path))
    return found.group(1) if found else ""
