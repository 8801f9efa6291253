"""The installer against a fake publisher and a fake machine, and once against a real archive."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import Any

import pytest

from llmgw.agent.discovery.host import Host
from llmgw.agent.provision.installer import (
    FAILED,
    INSTALLING,
    READY,
    UNSUPPORTED,
    Installer,
    Source,
    Want,
)
from llmgw.agent.provision.place import MARKER
from llmgw.agent.provision.release import ReleaseClient
from llmgw.agent.provision.runner import SubprocessRunner

LLAMA = [Want("llamacpp", "b1")]


def build_dir(installer: Installer, variant: str = "cpu") -> Path:
    return installer.root / "llamacpp" / f"b1-{variant}"


def leftovers(installer: Installer) -> list[str]:
    parent = installer.root / "llamacpp"
    return sorted(os.listdir(parent)) if parent.exists() else []


class TestInstallingFromNothing:
    async def test_an_engine_is_installed_from_nothing(
        self, installer: Installer, machine: Any, recorder: Any
    ) -> None:
        """A node rebuilt from a bare image ends with a checked build that has been run."""
        (st,) = await installer.converge(LLAMA)

        assert st.state == READY, st.detail
        assert st.detail == "llama-server version: 10991 (abc123)"
        assert "libgomp1" in machine.installed, "the OpenMP runtime the build links against was not installed"
        apt = machine.package_commands()
        assert apt[0][-1] == "update"
        assert apt[1][-3:] == ("-y", "--no-install-recommends", "libgomp1")
        assert all(
            env == {"DEBIAN_FRONTEND": "noninteractive"}
            for c, env in zip(machine.calls, machine.envs, strict=True)
            if c[0] == "apt-get"
        )
        binary = Path(st.binary)
        assert binary.is_relative_to(installer.root) and binary.name == "llama-server"
        assert os.readlink(binary.parent / "libllama.so") == "libllama.so.0", (
            "the library symlink was not unpacked"
        )
        assert any(
            s.state == INSTALLING and s.detail.startswith("downloading llama-b1-bin-ubuntu-x64.tar.gz (")
            for s in recorder.seen
        ), f"a download was not reported while it ran: {recorder.details()}"
        marker = json.loads((build_dir(installer) / MARKER).read_text())
        assert marker["engine"] == "llamacpp" and marker["variant"] == "cpu"
        assert marker["binary"] == "llama-b1/llama-server"
        assert marker["sha256"]["llama-b1-bin-ubuntu-x64.tar.gz"].startswith("sha256:")
        assert leftovers(installer) == ["b1-cpu"], "scratch directories were left behind"

    async def test_an_installed_engine_is_checked_not_fetched_again(
        self, installer: Installer, machine: Any, release: Any
    ) -> None:
        await installer.converge(LLAMA)
        asked = len(release.requests)
        before = len(machine.calls)

        (st,) = await installer.converge(LLAMA)

        assert st.state == READY, st.detail
        assert len(release.requests) == asked, f"a ready engine was fetched again: {release.requests[asked:]}"
        checked = [c[0] for c in machine.calls[before:]]
        assert checked == ["dpkg-query", "ldd", str(Path(st.binary))], "the installed build was not checked"

    async def test_an_installed_build_that_no_longer_runs_is_installed_again(
        self, installer: Installer, release: Any
    ) -> None:
        """A build damaged since it was installed is found on the next pass, and replaced."""
        (first,) = await installer.converge(LLAMA)
        os.unlink(first.binary)

        (st,) = await installer.converge(LLAMA)

        assert st.state == READY, st.detail
        assert os.access(st.binary, os.X_OK)
        assert len(release.downloads()) == 2

    async def test_a_removed_package_is_installed_again_when_the_build_is_checked(
        self, installer: Installer, machine: Any
    ) -> None:
        await installer.converge(LLAMA)
        machine.installed.discard("libgomp1")

        (st,) = await installer.converge(LLAMA)

        assert st.state == READY
        assert "libgomp1" in machine.installed


class TestRefusals:
    async def test_a_build_that_cannot_load_a_library_is_not_ready(
        self, installer: Installer, machine: Any
    ) -> None:
        """Once a node reported healthy with a llama-server that could not start for want of a library."""
        machine.installed.add("libgomp1")
        machine.ldd_output = "\tlibcuda.so.1 => not found\n\tlibc.so.6 => /lib/libc.so.6\n"

        (st,) = await installer.converge(LLAMA)

        assert st.state == FAILED
        assert st.detail == "llama-server cannot run on this system: libcuda.so.1 is not installed"
        assert not (build_dir(installer) / MARKER).exists(), "a build that does not run was marked installed"
        assert leftovers(installer) == []

    async def test_a_system_too_old_for_the_build_lists_its_shortfall_once(
        self, installer: Installer, machine: Any
    ) -> None:
        """RHEL 9: libstdc++ is there, one GCC release short; "not found" would send people hunting it."""
        machine.ldd_output = (
            "\t/lib64/libstdc++.so.6: version `GLIBCXX_3.4.30' not found (required by /x/libllama.so)\n"
            "\t/lib64/libstdc++.so.6: version `GLIBCXX_3.4.30' not found (required by /x/llama-server)\n"
            "\tlibgomp.so.1 => not found\n"
        )

        (st,) = await installer.converge(LLAMA)

        assert st.state == FAILED
        assert st.detail == (
            "llama-server cannot run on this system: libstdc++.so.6 is too old (needs GLIBCXX_3.4.30); "
            "libgomp.so.1 is not installed"
        )

    async def test_a_download_that_does_not_match_its_checksum_is_refused(
        self, installer: Installer, release: Any, kit: Any
    ) -> None:
        published = "0" * 64
        release.digests[kit.CPU_ASSET] = f"sha256:{published}"
        actual = kit.sha256(release.assets[kit.CPU_ASSET])

        (st,) = await installer.converge(LLAMA)

        assert st.state == FAILED
        assert st.detail == (
            f"{kit.CPU_ASSET} does not match the checksum its publisher gave "
            f"(got {actual[:12]}, expected {published[:12]}); it was not installed"
        )
        assert leftovers(installer) == []

    async def test_an_asset_the_publisher_gives_no_checksum_for_is_not_installed_unchecked(
        self, installer: Installer, release: Any, kit: Any
    ) -> None:
        del release.digests[kit.CPU_ASSET]

        (st,) = await installer.converge(LLAMA)

        assert st.state == FAILED
        assert st.detail == (
            f"its publisher gives no checksum for {kit.CPU_ASSET}, "
            "so it cannot be verified and is not installed"
        )
        assert release.downloads() == []

    async def test_a_release_that_does_not_exist_says_so(self, installer: Installer) -> None:
        (st,) = await installer.converge([Want("llamacpp", "b404")])

        assert (st.state, st.detail) == (FAILED, "ggml-org/llama.cpp has no release b404")

    @pytest.mark.parametrize("status", [403, 429])
    async def test_a_rate_limited_address_is_told_so(
        self, installer: Installer, release: Any, status: int
    ) -> None:
        release.api_status = status

        (st,) = await installer.converge(LLAMA)

        assert st.state == FAILED
        assert st.detail == (
            f"127.0.0.1:{release.url.rsplit(':', 1)[1]} is rate-limiting this address (HTTP {status}); "
            "the install is tried again later"
        )

    @pytest.mark.parametrize(
        ("files", "links"),
        [
            ({"../../escaped": "x", "llama-server": ""}, {}),
            ({"llama-server": ""}, {"lib": "/etc"}),
            ({"llama-server": ""}, {"up": "../../.."}),
            # A link that stays inside, then a file written through one that does not.
            ({"llama-server": ""}, {"a/here": ".", "a/out": "here/../.."}),
        ],
        ids=["dotdot-path", "absolute-link", "relative-link-out", "link-chain-out"],
    )
    async def test_an_archive_escaping_its_directory_is_refused(
        self, installer: Installer, release: Any, kit: Any, tmp_path: Path, files: Any, links: Any
    ) -> None:
        release.assets[kit.CPU_ASSET] = kit.tar_gz(files, links)
        release.digests[kit.CPU_ASSET] = "sha256:" + kit.sha256(release.assets[kit.CPU_ASSET])

        (st,) = await installer.converge(LLAMA)

        assert st.state == FAILED
        assert st.detail.startswith(f"{kit.CPU_ASSET} was refused: "), st.detail
        assert "outside" in st.detail
        assert not (tmp_path / "escaped").exists() and not (installer.root / "escaped").exists()
        assert leftovers(installer) == []

    async def test_an_engine_the_agent_cannot_install_says_so(
        self, installer: Installer, release: Any
    ) -> None:
        (st,) = await installer.converge([Want("sglang", "0.5.0")])

        assert st.state == UNSUPPORTED
        assert st.detail == (
            "this agent does not know how to install sglang; "
            "install it by hand and name it in the agent's configuration"
        )
        assert release.requests == []

    async def test_a_version_that_is_not_a_release_name_is_refused_before_it_names_a_path(
        self, installer: Installer, release: Any
    ) -> None:
        (st,) = await installer.converge([Want("llamacpp", "../../etc")])

        assert st.state == FAILED
        assert release.requests == []


class TestPackageManagers:
    async def test_a_red_hat_family_node_installs_libgomp_with_dnf(
        self, installer_for: Any, machine: Any, kit: Any
    ) -> None:
        """The build is not Ubuntu's in any way that matters; the package is named differently there."""
        machine.tools = {"dnf"}

        (st,) = await installer_for(kit.ROCKY).converge(LLAMA)

        assert st.state == READY, st.detail
        assert machine.package_commands() == [("dnf", "install", "-y", "libgomp")]
        assert "libgomp1" not in machine.installed

    async def test_a_red_hat_family_node_without_dnf_uses_yum(
        self, installer_for: Any, machine: Any, kit: Any
    ) -> None:
        machine.tools = {"yum"}

        (st,) = await installer_for(kit.ROCKY).converge(LLAMA)

        assert st.state == READY, st.detail
        assert machine.package_commands() == [("yum", "install", "-y", "libgomp")]

    async def test_a_suse_node_installs_libgomp_with_zypper_without_asking(
        self, installer_for: Any, machine: Any
    ) -> None:
        machine.tools = {"zypper"}
        suse = Host(os_id="opensuse-leap", id_like=("suse", "opensuse"), arch="amd64", cpu_flags=("avx2",))

        (st,) = await installer_for(suse).converge(LLAMA)

        assert st.state == READY, st.detail
        # The tool and its flags; the package's name is the rpm family's (recipes.py).
        ((*command, _package),) = machine.package_commands()
        assert command == ["zypper", "--non-interactive", "install"]

    async def test_a_package_already_installed_is_not_touched(
        self, installer: Installer, machine: Any
    ) -> None:
        machine.installed.add("libgomp1")

        (st,) = await installer.converge(LLAMA)

        assert st.state == READY
        assert machine.package_commands() == []

    async def test_a_busy_package_manager_is_waited_for(
        self, installer: Installer, machine: Any, recorder: Any
    ) -> None:
        """A new machine's cloud-init and unattended-upgrades hold apt's lists lock in its first minutes."""
        machine.locked = 3
        machine.lock_message = "E: Unable to lock directory /var/lib/apt/lists/"

        (st,) = await installer.converge(LLAMA)

        assert st.state == READY, f"gave up on a lock another apt-get held: {st.detail}"
        assert any("waiting for another apt-get to finish" in d for d in recorder.details()), (
            recorder.details()
        )

    async def test_a_package_manager_that_stays_busy_is_given_up_on(
        self, installer: Installer, machine: Any
    ) -> None:
        installer.lock_wait_s = 0.0
        machine.locked = 1000

        (st,) = await installer.converge(LLAMA)

        assert st.state == FAILED
        assert "Could not get lock" in st.detail

    async def test_a_package_command_failing_for_another_reason_is_not_retried(
        self, installer: Installer, machine: Any
    ) -> None:
        machine.package_failure = "E: Unable to locate package libgomp1"

        (st,) = await installer.converge(LLAMA)

        assert st.state == FAILED
        assert (
            st.detail
            == "`apt-get -o DPkg::Lock::Timeout=600 update` exited 100: E: Unable to locate package libgomp1"
        )
        assert len(machine.package_commands()) == 1

    async def test_a_system_of_no_known_family_is_not_refused_for_it(
        self, installer_for: Any, machine: Any
    ) -> None:
        """Its packages may be there; if not, ldd names the missing library."""
        (st,) = await installer_for(Host(os_id="gentoo", arch="amd64", cpu_flags=("avx2",))).converge(LLAMA)

        assert st.state == READY
        assert machine.package_commands() == []


class TestHardware:
    async def test_a_cpu_without_avx2_is_called_out_in_the_ready_detail(self, installer_for: Any) -> None:
        """A VM on QEMU's default CPU model runs several times slower and looks healthy otherwise."""
        slow = Host(os_id="ubuntu", id_like=("debian",), arch="amd64", cpu_flags=("avx",))

        (st,) = await installer_for(slow).converge(LLAMA)

        assert st.state == READY
        assert st.detail == (
            "llama-server version: 10991 (abc123); this CPU lacks avx2, so it will run several times slower "
            '(a VM needs CPU type "host")'
        )

    async def test_an_nvidia_node_installs_the_cuda_build_and_its_runtime(
        self, installer_for: Any, release: Any, kit: Any
    ) -> None:
        release.assets = {
            "llama-b1-bin-ubuntu-cuda-12.8-x64.tar.gz": kit.tar_gz({"build/bin/llama-server": "#!/bin/sh\n"}),
            "cudart-llama-b1-bin-ubuntu-cuda-12.8-x64.tar.gz": kit.tar_gz({"build/bin/libcudart.so.12": "x"}),
        }
        release.digests = {n: f"sha256:{kit.sha256(b)}" for n, b in release.assets.items()}
        gpu = Host(
            os_id="ubuntu", id_like=("debian",), arch="amd64", cpu_flags=("avx2",), nvidia_driver="570.86.15"
        )

        (st,) = await installer_for(gpu).converge(LLAMA)

        assert (st.state, st.variant) == (READY, "cuda-12.8"), st.detail
        assert (Path(st.binary).parent / "libcudart.so.12").exists()
        assert len(release.downloads()) == 2


class TestSources:
    async def test_a_mirror_and_the_control_planes_checksums_replace_the_publisher(
        self, installer: Installer, release: Any, kit: Any
    ) -> None:
        """An offline cluster: fetched from its mirror, checked against what the control plane holds."""
        release.api_status = 500  # the publisher's API must not be asked at all
        source = Source(
            base_url=f"{release.url}/mirror",
            checksums={kit.CPU_ASSET: "sha256:" + kit.sha256(release.assets[kit.CPU_ASSET])},
        )

        (st,) = await installer.converge(LLAMA, source)

        assert st.state == READY, st.detail
        assert release.api_calls() == []
        assert release.downloads() == [f"/mirror/ggml-org/llama.cpp/releases/download/b1/{kit.CPU_ASSET}"]

    async def test_a_mirror_without_a_checksum_for_an_asset_is_refused(
        self, installer: Installer, release: Any, kit: Any
    ) -> None:
        (st,) = await installer.converge(LLAMA, Source(base_url=f"{release.url}/mirror"))

        assert st.state == FAILED
        assert st.detail == (
            f"the control plane gives no checksum for {kit.CPU_ASSET}, "
            "so it cannot be verified and is not installed"
        )
        assert release.requests == []

    async def test_a_mirror_missing_the_archive_says_the_release_is_not_there(
        self, installer: Installer, release: Any, kit: Any
    ) -> None:
        digest = "sha256:" + kit.sha256(release.assets.pop(kit.CPU_ASSET))

        (st,) = await installer.converge(
            LLAMA, Source(base_url=f"{release.url}/mirror", checksums={kit.CPU_ASSET: digest})
        )

        assert (st.state, st.detail) == (
            FAILED,
            f"{release.url.removeprefix('http://')} has no {kit.CPU_ASSET} (HTTP 404): "
            "that release does not exist there",
        )


class TestInterruption:
    async def test_an_interrupted_install_leaves_nothing_that_looks_installed(
        self, installer: Installer, release: Any
    ) -> None:
        release.hold_downloads = asyncio.Event()
        task = asyncio.create_task(installer.converge(LLAMA))
        await asyncio.wait_for(release.download_started.wait(), timeout=30)

        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

        assert leftovers(installer) == []
        release.hold_downloads.set()
        release.hold_downloads = None
        (st,) = await installer.converge(LLAMA)
        assert st.state == READY


class TestARealArchive:
    async def test_a_real_archive_installs_through_unpack_ldd_and_version(
        self, tmp_path: Path, release: Any, releases: ReleaseClient, kit: Any
    ) -> None:
        """No fake runner: the archive is unpacked, ldd and `llama-server --version` really run."""
        script = (
            '#!/bin/sh\nif [ "$1" = "--version" ]; then echo "version: 4242 (test)" >&2; exit 0; fi\nexit 3\n'
        )
        release.assets[kit.CPU_ASSET] = kit.tar_gz(
            {"llama-b1/llama-server": script, "llama-b1/libllama.so.0": "x"},
            {"llama-b1/libllama.so": "libllama.so.0"},
        )
        release.digests[kit.CPU_ASSET] = "sha256:" + kit.sha256(release.assets[kit.CPU_ASSET])
        # A family nothing is known about, so no package manager is touched on this machine.
        host = Host(os_id="testos", arch="amd64", cpu_flags=("avx2",))
        installer = Installer(tmp_path / "engines", host, SubprocessRunner(), releases)

        (st,) = await installer.converge(LLAMA)

        assert st.state == READY, st.detail
        assert st.detail == "llama-server version: 4242 (test)"
        assert os.access(st.binary, os.X_OK)
        (again,) = await installer.converge(LLAMA)
        assert again.state == READY
        assert len(release.downloads()) == 1

    async def test_a_real_binary_that_fails_its_version_check_is_not_installed(
        self, tmp_path: Path, release: Any, releases: ReleaseClient, kit: Any
    ) -> None:
        release.assets[kit.CPU_ASSET] = kit.tar_gz(
            {"llama-server": "#!/bin/sh\necho 'Illegal instruction' >&2\nexit 132\n"}
        )
        release.digests[kit.CPU_ASSET] = "sha256:" + kit.sha256(release.assets[kit.CPU_ASSET])
        host = Host(os_id="testos", arch="amd64", cpu_flags=("avx2",))
        installer = Installer(tmp_path / "engines", host, SubprocessRunner(), releases)

        (st,) = await installer.converge(LLAMA)

        assert st.state == FAILED
        assert st.detail == "llama-server --version failed (exit 132): Illegal instruction"
        assert leftovers(installer) == []
