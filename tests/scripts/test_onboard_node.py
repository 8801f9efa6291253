"""scripts/onboard-node.sh, run with stand-in ssh and scp that act on a temporary root instead of a node."""

from __future__ import annotations

import os
import re
import stat
import subprocess
import sys
from pathlib import Path

import attrs
import pytest

from llmgw import __version__, config, pki
from llmgw.config import AgentConfig

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "onboard-node.sh"

# ssh runs the command here, with DESTDIR pointing the install at the node's
# root; scp copies into the directory `mktemp -d` gave. Both log what they did.
_SSH = """#!/usr/bin/env bash
while [ $# -gt 0 ]; do
  case "$1" in -o|-p|-i|-l) shift 2;; -*) shift;; *) break;; esac
done
target="$1"; shift
printf '%s\\n' "$target $*" >> "$LOG/ssh"
DESTDIR="$NODE_ROOT" exec bash -c "$*"
"""
_SCP = """#!/usr/bin/env bash
args=()
while [ $# -gt 0 ]; do
  case "$1" in -o|-P|-i) shift 2;; -*) shift;; *) args+=("$1"); shift;; esac
done
dest="${args[-1]#*:}"
unset 'args[-1]'
cp "${args[@]}" "$dest"
if [ -n "${CORRUPT:-}" ]; then for f in "$dest"/*.whl; do printf x >> "$f"; done; fi
"""
_SUDO = '#!/usr/bin/env bash\nexec "$@"\n'
_SYSTEMCTL = '#!/usr/bin/env bash\nprintf \'%s\\n\' "$*" >> "$LOG/systemctl"\n'
# python3 -m venv DIR makes a DIR/bin/pip that only writes down what it was asked to install.
_PYTHON3 = """#!/usr/bin/env bash
[ "$1 $2" = "-m venv" ] || exit 99
mkdir -p "$3/bin"
printf '#!/usr/bin/env bash\\nprintf "%%s\\\\n" "$*" >> "$LOG/pip"\\n' > "$3/bin/pip"
chmod +x "$3/bin/pip"
"""


@attrs.frozen
class Node:
    root: Path
    log: Path
    pki: Path
    env: dict[str, str]

    def onboard(self, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["bash", str(SCRIPT), "--pki", str(self.pki), *args],
            env={**self.env, **env},
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )

    def logged(self, name: str) -> list[str]:
        path = self.log / name
        return path.read_text().splitlines() if path.exists() else []


@pytest.fixture
def node(tmp_path: Path) -> Node:
    stand_ins, log, root = tmp_path / "bin", tmp_path / "log", tmp_path / "node"
    for directory in (stand_ins, log, root):
        directory.mkdir()
    for name, text in (
        ("ssh", _SSH),
        ("scp", _SCP),
        ("sudo", _SUDO),
        ("systemctl", _SYSTEMCTL),
        ("python3", _PYTHON3),
    ):
        (stand_ins / name).write_text(text)
        (stand_ins / name).chmod(0o755)
    authority = tmp_path / "pki"
    pki.init_ca(authority)
    llmgw_bin = Path(sys.executable).parent
    env = {
        "PATH": f"{stand_ins}:{llmgw_bin}:/usr/bin:/bin",
        "LOG": str(log),
        "NODE_ROOT": str(root),
        "HOME": str(tmp_path),
    }
    return Node(root=root, log=log, pki=authority, env=env)


class TestOnboardNode:
    def test_it_installs_llmgw_the_certificate_agent_yaml_and_unit_and_starts_the_agent(
        self, node: Node
    ) -> None:
        done = node.onboard(
            "--node", "gpu-01", "--addr", "10.0.0.21", "--ssh-user", "ops",
            "--server", "https://10.0.0.140:7443,10.0.0.141:7443",
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        etc = node.root / "etc/llmgw"
        agent = config.load(AgentConfig, etc / "agent.yaml")
        assert agent.node_id == "gpu-01"
        assert agent.servers == ["10.0.0.140:7443", "10.0.0.141:7443"]
        assert (agent.tls.ca, agent.tls.cert, agent.tls.key) == (
            "/etc/llmgw/ca.pem",
            "/etc/llmgw/agent.pem",
            "/etc/llmgw/agent-key.pem",
        )
        assert agent.fabric == "" and agent.hcas == []
        assert pki.is_issued_by(etc / "agent.pem", node.pki / "ca.pem")
        assert pki.certificate_names(etc / "agent.pem") == ["gpu-01"]
        assert (etc / "ca.pem").read_bytes() == (node.pki / "ca.pem").read_bytes()
        assert stat.S_IMODE((etc / "agent-key.pem").stat().st_mode) == 0o600
        unit = node.root / "etc/systemd/system/llmgw-agent.service"
        assert unit.read_bytes() == (REPO / "systemd/llmgw-agent.service").read_bytes()
        assert os.readlink(node.root / "usr/local/bin/llmgw") == "/opt/llmgw/bin/llmgw"
        assert node.logged("pip") == [f"install --quiet --upgrade llmgw=={__version__}"]
        assert node.logged("systemctl") == [
            "daemon-reload",
            "enable --quiet llmgw-agent",
            "restart llmgw-agent",
        ]
        assert all(line.startswith("ops@10.0.0.21 ") for line in node.logged("ssh"))
        assert "llmgw ctl nodes" in done.stdout
        # The node's copy of the files, key included, does not outlive the install.
        found = re.search(r"(/\S+)/install\.sh", node.logged("ssh")[-1])
        assert found is not None and not Path(found.group(1)).exists()

    def test_a_fabric_and_its_hcas_go_into_agent_yaml(self, node: Node) -> None:
        done = node.onboard(
            "--node", "gpu-02", "--addr", "gpu-02.lan", "--server", "10.0.0.140:7443",
            "--fabric", "ib-a:mlx5_0,mlx5_1",
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        agent = config.load(AgentConfig, node.root / "etc/llmgw/agent.yaml")
        assert agent.fabric == "ib-a" and agent.hcas == ["mlx5_0", "mlx5_1"]
        assert agent.servers == ["10.0.0.140:7443"]

    def test_a_wheel_is_installed_once_its_sha256_matches(self, node: Node, tmp_path: Path) -> None:
        wheel = tmp_path / f"llmgw-{__version__}-py3-none-any.whl"
        wheel.write_bytes(b"not really a wheel, but pip is a stand-in too")
        done = node.onboard(
            "--node", "gpu-03", "--addr", "gpu-03", "--server", "10.0.0.140:7443", "--wheel", str(wheel)
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        (line,) = node.logged("pip")
        assert line.startswith("install --quiet --upgrade /") and line.endswith(wheel.name)

    def test_a_wheel_damaged_on_the_way_is_refused_and_nothing_is_installed(
        self, node: Node, tmp_path: Path
    ) -> None:
        wheel = tmp_path / f"llmgw-{__version__}-py3-none-any.whl"
        wheel.write_bytes(b"the wheel as it left")
        done = node.onboard(
            "--node", "gpu-04", "--addr", "gpu-04", "--server", "10.0.0.140:7443", "--wheel", str(wheel),
            CORRUPT="1",
        )  # fmt: skip
        assert done.returncode == 1
        assert "arrived on gpu-04 with another sha256 than it left with; nothing was installed" in done.stderr
        assert node.logged("pip") == [] and node.logged("systemctl") == []
        assert not (node.root / "etc/llmgw").exists()

    def test_onboarding_again_keeps_an_edited_agent_yaml_beside_the_new_one(self, node: Node) -> None:
        args = ("--node", "gpu-05", "--addr", "gpu-05", "--server", "10.0.0.140:7443")
        assert node.onboard(*args).returncode == 0
        agent_yaml = node.root / "etc/llmgw/agent.yaml"
        agent_yaml.write_text(agent_yaml.read_text() + "labels: {rack: r7}\n")
        assert node.onboard(*args).returncode == 0
        assert "rack: r7" in (agent_yaml.parent / "agent.yaml.bak").read_text()
        assert "rack" not in agent_yaml.read_text()

    def test_without_the_authority_it_stops_before_touching_the_node(
        self, node: Node, tmp_path: Path
    ) -> None:
        done = node.onboard(
            "--node", "gpu-06", "--addr", "gpu-06", "--server", "10.0.0.140:7443",
            "--pki", str(tmp_path / "none"),
        )  # fmt: skip
        assert done.returncode == 1 and "there is no readable certificate authority" in done.stderr
        assert node.logged("ssh") == []

    def test_missing_required_options_print_the_usage(self, node: Node) -> None:
        done = node.onboard("--node", "gpu-07")
        assert done.returncode == 2 and "usage: onboard-node.sh" in done.stderr
