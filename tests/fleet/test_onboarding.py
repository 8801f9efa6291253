"""scripts/onboard-node.sh across real hosts: the operator's ssh, a node's sshd, and the control plane.

Three namespace hosts of the fleet (conftest.py): `mh` is the operator's machine,
where the authority is and the script runs; `n1` is the node, with Debian's
sshd; `cp` runs the control plane. Nothing stands in: ssh, scp, sshd, python3's
venv and pip are the real ones, and llmgw is a wheel of this tree with the
dependencies it names, so what the node runs afterwards is what onboarding made.

Each namespace shares the machine's files, so the node's /etc, /opt, /usr/local,
/var and /root (and the operator's /root, for its ssh configuration) are
overlays in a mount namespace of their own, their changes on a tmpfs that goes
with it: onboarding "the node" never writes the machine's real /opt/llmgw or
/etc/llmgw.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import attrs
import pytest

from .. import needs
from .cluster import AGENT_PORT, GATEWAY_PORT, Fleet, http
from .netns import Host, Process, wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(420)]

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "onboard-node.sh"
# Dependencies downloaded once and kept across runs, by what setup.cfg asks for.
WHEEL_CACHE = Path(
    os.environ.get("LLMGW_ONBOARD_WHEELS", Path.home() / ".cache" / "llmgw" / "onboarding-wheels")
)
SIM = {"name": "sim-chat", "replicas": 1, "profiles": [{"engine": "sim"}]}
# What sshd and the agent see: a login's environment, not this test's (its PYTHONPATH
# would make the node's llmgw this tree's sources instead of the wheel installed there).
_CLEAN_ENV = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"}

# Runs as `sh -c _PRIVATE_ROOT sh DIR DIRS... -- ARGV...` inside a new mount namespace: each
# of DIRS becomes an overlay whose changes go to a tmpfs on DIR, /run an empty tmpfs (no
# systemd, whatever this machine runs; sshd's privilege separation directory), then ARGV.
_PRIVATE_ROOT = """
set -e
top="$1"; shift
mount -t tmpfs private-disk "$top"
while [ "$1" != -- ]; do
  mkdir -p "$top/up$1" "$top/work$1"
  mount -t overlay "private$1" -o "lowerdir=$1,upperdir=$top/up$1,workdir=$top/work$1" "$1"
  shift
done
shift
mount -t tmpfs private-run /run
mkdir -p /run/sshd
exec "$@"
"""
_NODE_DIRS = ["/etc", "/opt", "/usr/local", "/var", "/root"]


def _private(top: Path, dirs: list[str], argv: list[str]) -> list[str]:
    top.mkdir(parents=True, exist_ok=True)
    return [
        "unshare", "--mount", "--propagation", "private",
        "sh", "-c", _PRIVATE_ROOT, "sh", str(top), *dirs, "--", *argv,
    ]  # fmt: skip


def _setup_cfg_requirements() -> str:
    text = (REPO / "setup.cfg").read_text()
    return text.split("install_requires =", 1)[1].split("\n\n", 1)[0]


@pytest.fixture(scope="module")
def wheelhouse(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A wheel of this tree and every dependency it names: a bundle's wheels/, as an operator has it."""
    house = tmp_path_factory.mktemp("wheelhouse")
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--quiet"]
    subprocess.run(
        [*pip, "wheel", "--no-deps", "--no-build-isolation", "--wheel-dir", str(house), str(REPO)],
        check=True,
        timeout=300,
    )
    (own,) = house.glob("llmgw-*.whl")
    key = hashlib.sha256(f"{sys.version_info[:2]} {_setup_cfg_requirements()}".encode()).hexdigest()[:16]
    cached = WHEEL_CACHE / key
    if not cached.is_dir():
        # Downloaded beside the cache and renamed into it: an interrupted download is never taken
        # for a whole one by the next run.
        partial = WHEEL_CACHE / f"{key}.{os.getpid()}.partial"
        shutil.rmtree(partial, ignore_errors=True)
        subprocess.run(
            [*pip, "download", "--only-binary=:all:", "--dest", str(partial), str(own)],
            check=True,
            timeout=600,
        )
        for path in partial.glob("llmgw-*.whl"):
            path.unlink()
        try:
            partial.rename(cached)
        except OSError:
            if not cached.is_dir():
                raise
            shutil.rmtree(partial)  # another run beside this one filled it first
    for path in cached.glob("*.whl"):
        shutil.copyfile(path, house / path.name)
    return house


@attrs.frozen
class Ssh:
    """A node's sshd (its configuration and keys) and the operator's side of it."""

    node: Host
    dir: Path

    @classmethod
    def create(cls, node: Host, directory: Path) -> Ssh:
        directory.mkdir()
        for name in ("host_key", "operator_key"):
            subprocess.run(
                ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(directory / name)], check=True
            )
        (directory / "authorized_keys").write_text((directory / "operator_key.pub").read_text())
        host_key = (directory / "host_key.pub").read_text().split()
        (directory / "known_hosts").write_text(f"{node.address} {host_key[0]} {host_key[1]}\n")
        (directory / "sshd_config").write_text(
            f"ListenAddress {node.address}:22\n"
            f"HostKey {directory / 'host_key'}\n"
            f"AuthorizedKeysFile {directory / 'authorized_keys'}\n"
            "PermitRootLogin prohibit-password\nPasswordAuthentication no\n"
            "KbdInteractiveAuthentication no\nUsePAM no\nPidFile none\n"
            # Its files are in the test's temporary directory, under a /tmp that others write too.
            "StrictModes no\n"
            # scp speaks SFTP since OpenSSH 9.0.
            "Subsystem sftp internal-sftp\n"
        )
        (directory / "ssh_config").write_text(
            f"Host {node.address}\n  User root\n  IdentityFile {directory / 'operator_key'}\n"
            f"  IdentitiesOnly yes\n  UserKnownHostsFile {directory / 'known_hosts'}\n"
            "  StrictHostKeyChecking yes\n"
        )
        return cls(node, directory)

    def start_sshd(self) -> Process:
        """Debian's sshd on the node's address, port 22, with a private root (see the module's docstring)."""
        sshd = needs.program("sshd", "openssh-server")
        argv = _private(
            self.dir / "node-root", _NODE_DIRS, [sshd, "-D", "-e", "-f", str(self.dir / "sshd_config")]
        )
        process = self.node.run(argv, self.dir / "sshd.log", env=_CLEAN_ENV, name="sshd")
        wait_until(
            lambda: (self.node.address, 22) in self.node.listening_ports() or not process.alive(),
            30,
            "sshd to listen",
        )
        assert process.alive(), f"sshd exited:\n{process.output()}"
        return process

    def on_node(self, sshd: Process, argv: list[str]) -> list[str]:
        """argv in the node's own files: the mount namespace sshd, and so onboarding, wrote in.

        sshd.pid is sshd's own: `ip netns exec`, `unshare` without --fork and `sh -c 'exec'` each
        replace themselves with the next.
        """
        return ["nsenter", f"--mount=/proc/{sshd.pid}/ns/mnt", "--", *argv]

    def node_has(self, sshd: Process, path: str) -> bool:
        done = subprocess.run(self.on_node(sshd, ["test", "-e", path]), check=False)
        return done.returncode == 0


@pytest.fixture
def ssh(fleet: Fleet, tmp_path: Path) -> Ssh:
    needs.program("ssh", "openssh-client")
    return Ssh.create(fleet.network.hosts["n1"], tmp_path / "ssh")


@pytest.fixture
def operator_bin(tmp_path: Path) -> Path:
    """A PATH directory whose `llmgw` is this tree's: the script issues the node's certificate with it."""
    directory = tmp_path / "operator-bin"
    directory.mkdir()
    (directory / "llmgw").write_text(f'#!/bin/sh\nexec {sys.executable} -m llmgw "$@"\n')
    (directory / "llmgw").chmod(0o755)
    return directory


def _onboard(fleet: Fleet, ssh: Ssh, operator_bin: Path, house: Path) -> Process:
    """onboard-node.sh started on the operator's host (mh), with ssh configured in its own ~/.ssh."""
    operator = fleet.network.hosts["mh"]
    script = [
        "sh", "-c", 'mkdir -p -m 0700 /root/.ssh && cp "$0" /root/.ssh/config && exec "$@"',
        str(ssh.dir / "ssh_config"),
        "bash", str(SCRIPT), "--node", "n1", "--addr", ssh.node.address,
        "--server", f"{fleet.cp.address}:{AGENT_PORT}", "--pki", str(fleet.certificates.dir),
        "--wheelhouse", str(house), "--wait-ssh", "60",
    ]  # fmt: skip
    env = {**os.environ, "PATH": f"{operator_bin}:{os.environ['PATH']}"}
    argv = _private(fleet.workdir / "operator-root", ["/root"], script)
    return operator.run(argv, fleet.workdir / "logs" / "onboard.log", env=env, name="onboard-node.sh")


def _the_machines_own() -> dict[str, bool]:
    """Whether this machine's real /opt/llmgw and the rest are there: onboarding the node changes none."""
    return {
        path: Path(path).exists() for path in ("/opt/llmgw", "/etc/llmgw/agent.yaml", "/usr/local/bin/llmgw")
    }


def _finished(process: Process) -> int:
    return process.popen.wait(300)


def test_a_node_onboarded_over_real_ssh_joins_and_serves_a_chat_to_the_operator(
    fleet: Fleet, ssh: Ssh, operator_bin: Path, wheelhouse: Path
) -> None:
    machines = _the_machines_own()
    fleet.start_server([])
    sshd = ssh.start_sshd()
    onboarding = _onboard(fleet, ssh, operator_bin, wheelhouse)
    assert _finished(onboarding) == 0, onboarding.output()
    said = onboarding.output()
    assert "there is no systemd on n1" in said
    (command,) = re.findall(r"keep it running.*:\n\s+(\S.*)\n", said)
    assert command == "/usr/local/bin/llmgw --role=agent --config /etc/llmgw/agent.yaml"
    assert _the_machines_own() == machines

    # Started as the script says, in the node's own files, by what onboarding installed there.
    ssh.node.run(ssh.on_node(sshd, ["sh", "-c", command]), fleet.workdir / "logs" / "n1.log", env=_CLEAN_ENV)
    fleet.wait_connected("n1")
    fleet.add_model(SIM)
    (replica,) = fleet.wait_ready("sim-chat", 1)
    assert replica["node"] == "n1"
    reply = fleet.network.hosts["mh"].call(
        http,
        "POST",
        f"http://{fleet.cp.address}:{GATEWAY_PORT}/v1/chat/completions",
        {"model": "sim-chat", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4},
        {"Authorization": f"Bearer {fleet.key}"},
    )
    assert reply.status == 200, reply.body
    assert reply.body["choices"][0]["message"]["content"]


def test_a_node_whose_sshd_is_not_up_yet_is_waited_for_and_onboarded(
    fleet: Fleet, ssh: Ssh, operator_bin: Path, wheelhouse: Path
) -> None:
    onboarding = _onboard(fleet, ssh, operator_bin, wheelhouse)
    wait_until(
        lambda: "does not answer ssh yet" in onboarding.output() or not onboarding.alive(),
        60,
        "the script to say it waits for ssh",
    )
    assert "Connection refused" in onboarding.output()
    sshd = ssh.start_sshd()
    assert _finished(onboarding) == 0, onboarding.output()
    assert "n1 has llmgw" in onboarding.output()
    assert ssh.node_has(sshd, "/opt/llmgw/bin/llmgw")


def test_a_wheelhouse_missing_a_dependency_fails_in_pips_words_and_leaves_no_opt_llmgw_on_the_node(
    fleet: Fleet, ssh: Ssh, operator_bin: Path, wheelhouse: Path, tmp_path: Path
) -> None:
    lacking = tmp_path / "lacking"
    shutil.copytree(wheelhouse, lacking)
    for path in lacking.glob("click-*.whl"):
        path.unlink()
    sshd = ssh.start_sshd()
    onboarding = _onboard(fleet, ssh, operator_bin, lacking)
    assert _finished(onboarding) == 1, onboarding.output()
    said = onboarding.output()
    assert "pip: ERROR: Could not find a version that satisfies the requirement click" in said
    assert "removed the /opt/llmgw this install had begun on n1" in said
    assert not ssh.node_has(sshd, "/opt/llmgw")
    assert ssh.node_has(sshd, "/opt")
    assert not Path("/opt/llmgw").exists()
