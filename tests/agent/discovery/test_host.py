"""Host discovery from files a test writes: os-release, cpuinfo, the NVIDIA module's version."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmgw.agent.discovery.host import NO_AVX2_WARNING, Host, debian_arch, discover_host, read_host

UBUNTU_OS_RELEASE = """\
PRETTY_NAME="Ubuntu 24.04.1 LTS"
NAME="Ubuntu"
VERSION_ID="24.04"
VERSION_CODENAME=noble
ID=ubuntu
ID_LIKE=debian
"""

ROCKY_OS_RELEASE = """\
NAME="Rocky Linux"
VERSION="10.0 (Red Quartz)"
ID="rocky"
ID_LIKE="rhel centos fedora"
VERSION_ID="10.0"
"""

X86_CPUINFO = """\
processor\t: 0
vendor_id\t: GenuineIntel
flags\t\t: fpu vme sse sse2 ssse3 fma sse4_1 sse4_2 avx f16c avx2 avx512f avx512_bf16 amx_tile hypervisor

processor\t: 1
flags\t\t: fpu sse
"""

ARM_CPUINFO = """\
processor\t: 0
BogoMIPS\t: 50.00
Features\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics sve
"""

PROPRIETARY = (
    "NVRM version: NVIDIA UNIX x86_64 Kernel Module  570.86.15  Thu Jan 23 2025\nGCC version: gcc 13\n"
)
OPEN = (
    "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.65.06  Release Build  (dvs-builder@U16)\n"
)


def machine(
    tmp_path: Path, os_release: str = "", cpuinfo: str = "", nvidia: str | None = None, arch: str = "x86_64"
) -> Host:
    (tmp_path / "os-release").write_text(os_release)
    (tmp_path / "cpuinfo").write_text(cpuinfo)
    if nvidia is not None:
        (tmp_path / "nvidia").write_text(nvidia)
    return read_host(tmp_path / "os-release", tmp_path / "cpuinfo", tmp_path / "nvidia", machine=arch)


class TestOperatingSystem:
    def test_ubuntu_is_read_from_os_release_and_packaged_as_deb(self, tmp_path: Path) -> None:
        host = machine(tmp_path, UBUNTU_OS_RELEASE)

        assert (host.os_id, host.os_version, host.os_codename, host.id_like) == (
            "ubuntu",
            "24.04",
            "noble",
            ("debian",),
        )
        assert host.family == "deb"

    def test_a_red_hat_derivative_is_packaged_as_rpm_because_of_its_id_like(self, tmp_path: Path) -> None:
        host = machine(tmp_path, ROCKY_OS_RELEASE)

        assert (host.os_id, host.os_version, host.id_like) == ("rocky", "10.0", ("rhel", "centos", "fedora"))
        assert host.family == "rpm"

    def test_a_derivative_nobody_listed_finds_its_family_through_id_like(self) -> None:
        assert Host(os_id="pop", id_like=("ubuntu", "debian")).family == "deb"
        assert Host(os_id="opensuse-leap", id_like=("suse", "opensuse")).family == "rpm"

    def test_an_unknown_or_missing_os_release_has_no_family(self, tmp_path: Path) -> None:
        assert Host(os_id="gentoo").family == ""
        host = read_host(tmp_path / "absent", tmp_path / "absent", tmp_path / "absent", machine="x86_64")
        assert (host.os_id, host.family) == ("", "")


class TestProcessor:
    @pytest.mark.parametrize(
        ("kernel", "debian"),
        [
            ("x86_64", "amd64"),
            ("aarch64", "arm64"),
            ("armv7l", "armhf"),
            ("ppc64le", "ppc64el"),
            ("riscv64", "riscv64"),
        ],
    )
    def test_the_architecture_is_spelled_as_debian_does(self, kernel: str, debian: str) -> None:
        assert debian_arch(kernel) == debian

    def test_only_the_x86_flags_inference_cares_about_are_kept_from_the_first_processor(
        self, tmp_path: Path
    ) -> None:
        host = machine(tmp_path, cpuinfo=X86_CPUINFO)

        assert host.cpu_flags == ("avx", "avx2", "fma", "f16c", "avx512f", "avx512_bf16", "amx_tile")
        assert host.arch == "amd64"

    def test_arm_features_are_read_too(self, tmp_path: Path) -> None:
        host = machine(tmp_path, cpuinfo=ARM_CPUINFO, arch="aarch64")

        assert (host.arch, host.cpu_flags) == ("arm64", ("asimd", "sve"))

    def test_an_x64_cpu_without_avx2_is_warned_about_in_an_operators_words(self) -> None:
        assert Host(arch="amd64", cpu_flags=("avx",)).warnings() == [NO_AVX2_WARNING]
        assert NO_AVX2_WARNING == 'no AVX2: inference runs several times slower (a VM needs CPU type "host")'
        assert Host(arch="amd64", cpu_flags=("avx2",)).warnings() == []
        assert Host(arch="arm64").warnings() == []


class TestNvidiaDriver:
    @pytest.mark.parametrize(("text", "version"), [(PROPRIETARY, "570.86.15"), (OPEN, "580.65.06")])
    def test_the_loaded_modules_version_is_read(self, tmp_path: Path, text: str, version: str) -> None:
        assert machine(tmp_path, nvidia=text).nvidia_driver == version

    def test_no_loaded_module_means_no_driver(self, tmp_path: Path) -> None:
        assert machine(tmp_path).nvidia_driver == ""


def test_the_host_travels_in_register_with_its_family(tmp_path: Path) -> None:
    host = machine(tmp_path, ROCKY_OS_RELEASE, X86_CPUINFO, PROPRIETARY)

    msg = host.to_proto()

    assert (msg.os_id, msg.os_version, msg.arch, msg.family, msg.nvidia_driver) == (
        "rocky",
        "10.0",
        "amd64",
        "rpm",
        "570.86.15",
    )
    assert msg.id_like == ["rhel", "centos", "fedora"]
    assert "avx2" in msg.cpu_flags
    assert host.describe() == "rocky 10.0 amd64, NVIDIA 570.86.15"


async def test_discovery_reads_its_files_off_the_event_loop(tmp_path: Path) -> None:
    """The blockbuster fixture fails this test if any file is read on the loop."""
    (tmp_path / "os-release").write_text(UBUNTU_OS_RELEASE)
    (tmp_path / "cpuinfo").write_text(X86_CPUINFO)

    host = await discover_host(
        tmp_path / "os-release", tmp_path / "cpuinfo", tmp_path / "nvidia", machine="x86_64"
    )

    assert (host.os_id, host.arch, host.family) == ("ubuntu", "amd64", "deb")


async def test_this_machine_can_be_discovered() -> None:
    host = await discover_host()

    assert host.arch
