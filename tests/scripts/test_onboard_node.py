"""scripts/onboard-node.sh, run with stand-in ssh and scp that act on a temporary root instead of a node."""

from __future__ import annotations

import base64
import hashlib
import os
import re
import stat
import subprocess
import sys
import zipfile
from pathlib import Path

import attrs
import pytest

from llmgw import __version__, config, pki
from llmgw.config import AgentConfig

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "onboard-node.sh"

# ssh runs the command here, with DESTDIR pointing the install at the node's
# root; scp copies into the directory `mktemp -d` gave. Both log what they did.
# ssh runs the command here, with DESTDIR pointing the install at the node's
# root; scp copies into the directory `mktemp -d` gave. Both log what they did.
# SSH_DOWN=N: the first N tries are refused, as by a machine still booting.
_SSH = """#!/usr/bin/env bash
while [ $# -gt 0 ]; do
  case "$1" in -o|-p|-i|-l) shift 2;; -*) shift;; *) break;; esac
done
target="$1"; shift
printf '%s\\n' "$target $*" >> "$LOG/ssh"
tries=$(cat "$LOG/ssh-tries" 2>/dev/null || echo 0)
echo $((tries + 1)) > "$LOG/ssh-tries"
if [ "$tries" -lt "${SSH_DOWN:-0}" ]; then
  echo "ssh: connect to host ${target#*@} port 22: Connection refused" >&2; exit 255
fi
if [ -n "${SSH_DENIED:-}" ]; then echo "$target: Permission denied (publickey)." >&2; exit 255; fi
DESTDIR="$NODE_ROOT" exec bash -c "$*"
"""
_SCP = """#!/usr/bin/env bash
args=()
while [ $# -gt 0 ]; do
  case "$1" in -o|-P|-i) shift 2;; -*) shift;; *) args+=("$1"); shift;; esac
done
dest="${args[-1]#*:}"
unset 'args[-1]'
cp -r "${args[@]}" "$dest"
if [ -n "${CORRUPT:-}" ]; then for f in "$dest"/*.whl; do printf x >> "$f"; done; fi
if [ -n "${CORRUPT_WHEELHOUSE:-}" ]; then printf x >> "$dest/wheelhouse/$CORRUPT_WHEELHOUSE"; fi
"""
_SUDO = '#!/usr/bin/env bash\nexec "$@"\n'
_SYSTEMCTL = '#!/usr/bin/env bash\nprintf \'%s\\n\' "$*" >> "$LOG/systemctl"\n'
# python3 -m venv DIR makes a DIR/bin/pip that writes down what it was asked to
# install (PIP_FAILS: fails saying so; `download`: leaves PIP_WHEEL_BYTES as the
# wheel), and a DIR/bin/llmgw whose engine checks find llama.cpp alone.
_PYTHON3 = """#!/usr/bin/env bash
[ "$1 $2" = "-m venv" ] || exit 99
mkdir -p "$3/bin"
cp "$STAND_INS/venv-pip" "$3/bin/pip"
cp "$STAND_INS/venv-llmgw" "$3/bin/llmgw"
"""
_VENV_PIP = """#!/usr/bin/env bash
printf '%s\\n' "$*" >> "$LOG/pip"
if [ -n "${PIP_FAILS:-}" ]; then echo "$PIP_FAILS" >&2; exit 1; fi
if [ "$1" = download ]; then
  while [ "$1" != --dest ]; do shift; done
  printf '%s' "$PIP_WHEEL_BYTES" > "$2/llmgw-$VERSION-py3-none-any.whl"
fi
"""
_VENV_LLMGW = """#!/usr/bin/env bash
case "$*" in
  "ctl engine-check llamacpp") echo 'ok: every flag llmgw passes is in `llama-server --help`';;
  *) echo "llmgw ctl engine-check: no ${3} binary on the PATH" >&2; exit 4;;
esac
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
        ("venv-pip", _VENV_PIP),
        ("venv-llmgw", _VENV_LLMGW),
    ):
        (stand_ins / name).write_text(text)
        (stand_ins / name).chmod(0o755)
    # A node booted with systemd; a test takes this away to have one without.
    (root / "run/systemd/system").mkdir(parents=True)
    authority = tmp_path / "pki"
    pki.init_ca(authority)
    llmgw_bin = Path(sys.executable).parent
    env = {
        "PATH": f"{stand_ins}:{llmgw_bin}:/usr/bin:/bin",
        "LOG": str(log),
        "NODE_ROOT": str(root),
        "HOME": str(tmp_path),
        "STAND_INS": str(stand_ins),
        "VERSION": __version__,
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


def _wheelhouse(tmp_path: Path) -> Path:
    """A bundle's wheels/: llmgw at this version and one dependency."""
    house = tmp_path / "wheels"
    house.mkdir()
    (house / f"llmgw-{__version__}-py3-none-any.whl").write_bytes(b"llmgw's wheel")
    (house / "grpclib-0.4.7-py3-none-any.whl").write_bytes(b"a dependency's wheel")
    return house


_ARGS = ("--node", "n1", "--addr", "198.18.0.11", "--server", "198.18.0.10:7443")


class TestPinnedInstall:
    def test_a_wheelhouse_installs_llmgw_and_its_dependencies_without_asking_the_index(
        self, node: Node, tmp_path: Path
    ) -> None:
        done = node.onboard(*_ARGS, "--wheelhouse", str(_wheelhouse(tmp_path)))
        assert done.returncode == 0, done.stderr
        (line,) = node.logged("pip")
        assert line.startswith("install --quiet --upgrade --no-index --find-links /")
        assert line.endswith(f"/wheelhouse/llmgw-{__version__}-py3-none-any.whl")

    def test_a_wheelhouse_file_changed_on_the_way_is_refused_before_pip_runs(
        self, node: Node, tmp_path: Path
    ) -> None:
        done = node.onboard(
            *_ARGS, "--wheelhouse", str(_wheelhouse(tmp_path)),
            CORRUPT_WHEELHOUSE="grpclib-0.4.7-py3-none-any.whl",
        )  # fmt: skip
        assert done.returncode == 1
        assert (
            "the wheelhouse arrived on n1 with files whose sha256 is not what they left with" in done.stderr
        )
        assert "grpclib-0.4.7-py3-none-any.whl: FAILED" in done.stderr
        assert node.logged("pip") == []
        assert not (node.root / "opt/llmgw").exists() and not (node.root / "etc/llmgw").exists()

    def test_a_wheelhouse_without_the_version_is_refused_before_the_node_is_touched(
        self, node: Node, tmp_path: Path
    ) -> None:
        done = node.onboard(*_ARGS, "--wheelhouse", str(_wheelhouse(tmp_path)), "--version", "9.9.9")
        assert done.returncode == 1
        assert f"holds no wheel of llmgw 9.9.9 (its llmgw wheels: llmgw-{__version__}-py3-none-any.whl" in (
            done.stderr
        )
        assert node.logged("ssh") == []

    def test_a_dependency_the_index_cannot_give_says_what_to_do_and_leaves_no_opt_llmgw(
        self, node: Node
    ) -> None:
        said = "ERROR: Could not find a version that satisfies the requirement grpclib>=0.4"
        done = node.onboard(*_ARGS, PIP_FAILS=said)
        assert done.returncode == 1
        assert f"pip: {said}" in done.stderr
        assert f"llmgw {__version__} could not be installed on n1 from the package index" in done.stderr
        assert "--wheelhouse DIR (a bundle's wheels/) or --mirror URL; see docs/offline.md" in done.stderr
        assert "removed the /opt/llmgw this install had begun on n1" in done.stderr
        assert not (node.root / "opt/llmgw").exists() and not (node.root / "etc/llmgw").exists()
        assert node.logged("systemctl") == []

    def test_a_version_the_index_does_not_have_offers_the_wheel_not_the_network(self, node: Node) -> None:
        """`server init`'s line without --wheel, for llmgw built from a checkout: pip finds no llmgw."""
        said = f"ERROR: No matching distribution found for llmgw=={__version__}"
        done = node.onboard(*_ARGS, PIP_FAILS=said)
        assert done.returncode == 1
        assert f"The index has no llmgw {__version__}: a version built from a checkout is on none." in (
            done.stderr
        )
        assert "Give its wheel with --wheel FILE" in done.stderr
        assert "A node that cannot reach the index" not in done.stderr

    def test_a_failed_upgrade_keeps_the_llmgw_already_installed(self, node: Node) -> None:
        assert node.onboard(*_ARGS).returncode == 0
        done = node.onboard(*_ARGS, PIP_FAILS="ERROR: No matching distribution found for llmgw==0.2")
        assert done.returncode == 1 and "removed" not in done.stderr
        assert (node.root / "opt/llmgw/bin/pip").exists()

    def test_with_sha256_the_wheel_is_downloaded_checked_and_installed_alone(self, node: Node) -> None:
        mirror = "http://198.18.0.10:8081/files/wheels/"
        done = node.onboard(
            *_ARGS, "--mirror", mirror, "--sha256", hashlib.sha256(b"the wheel").hexdigest().upper(),
            PIP_WHEEL_BYTES="the wheel",
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        download, install = node.logged("pip")
        assert download.startswith("download --quiet --no-deps --only-binary=:all: --dest download")
        assert download.endswith(f"--no-index --find-links {mirror} llmgw=={__version__}")
        assert install.startswith(f"install --quiet --upgrade --no-index --find-links {mirror} /")
        assert install.endswith(f"/download/llmgw-{__version__}-py3-none-any.whl")

    def test_a_wheel_that_is_not_the_one_the_sha256_names_is_refused_before_the_node_is_touched(
        self, node: Node, tmp_path: Path
    ) -> None:
        wheel = tmp_path / f"llmgw-{__version__}-py3-none-any.whl"
        wheel.write_bytes(b"some other build")
        done = node.onboard(*_ARGS, "--wheel", str(wheel), "--sha256", "0" * 64)
        assert done.returncode == 1
        assert f"not the {'0' * 64} given with --sha256; the node was not touched" in done.stderr
        assert node.logged("ssh") == []

    def test_a_downloaded_wheel_with_another_sha256_is_refused_and_nothing_is_left(self, node: Node) -> None:
        wanted = hashlib.sha256(b"the wheel").hexdigest()
        done = node.onboard(*_ARGS, "--sha256", wanted, PIP_WHEEL_BYTES="another wheel")
        assert done.returncode == 1
        assert f"the package index served llmgw-{__version__}-py3-none-any.whl with sha256" in done.stderr
        assert f"not the {wanted} given with --sha256; nothing was installed" in done.stderr
        assert len(node.logged("pip")) == 1
        assert not (node.root / "opt/llmgw").exists()


class TestTheNode:
    def test_it_waits_for_a_machine_still_booting_to_answer_ssh(self, node: Node) -> None:
        done = node.onboard(*_ARGS, SSH_DOWN="2")
        assert done.returncode == 0, done.stderr
        assert (
            "== 198.18.0.11 does not answer ssh yet (ssh: connect to host 198.18.0.11 port 22: "
            "Connection refused); waiting up to 120 s\n"
        ) in done.stdout
        assert node.logged("ssh")[:3] == ["198.18.0.11 true"] * 3

    def test_a_machine_that_never_answers_is_named_with_what_ssh_said(self, node: Node) -> None:
        done = node.onboard(*_ARGS, "--wait-ssh", "0", SSH_DOWN="1000")
        assert done.returncode == 1
        assert (
            "198.18.0.11 did not answer ssh within 0 s (--wait-ssh): "
            "ssh: connect to host 198.18.0.11 port 22: Connection refused"
        ) in done.stderr
        assert list(node.root.iterdir()) == [node.root / "run"]

    def test_a_refused_login_is_not_waited_for(self, node: Node) -> None:
        done = node.onboard(*_ARGS, "--wait-ssh", "3600", SSH_DENIED="1")
        assert done.returncode == 1
        assert "198.18.0.11 answers ssh but will not let us in: " in done.stderr
        assert "Permission denied (publickey)" in done.stderr
        assert len(node.logged("ssh")) == 1

    def test_without_systemd_it_says_so_and_prints_the_command_the_unit_runs(self, node: Node) -> None:
        (node.root / "run/systemd/system").rmdir()
        done = node.onboard(*_ARGS)
        assert done.returncode == 0, done.stderr
        assert "there is no systemd on n1 (no /run/systemd/system), so llmgw-agent was not started" in (
            done.stdout
        )
        assert "\n     /usr/local/bin/llmgw --role=agent --config /etc/llmgw/agent.yaml\n" in done.stdout
        assert "n1 has llmgw" in done.stdout and "its agent is not running" in done.stdout
        assert node.logged("systemctl") == []
        assert (node.root / "etc/llmgw/agent.yaml").is_file()

    def test_it_ends_with_what_the_nodes_engine_checks_found(self, node: Node) -> None:
        done = node.onboard(*_ARGS)
        assert done.returncode == 0, done.stderr
        assert "== the engine checks on n1 (llmgw ctl engine-check):" in done.stdout
        assert "   llamacpp: ok: every flag llmgw passes is in `llama-server --help`" in done.stdout
        assert "   vllm: not installed yet (the agent installs it when a model needs it)" in done.stdout


def test_every_option_the_usage_names_is_in_cli_md() -> None:
    usage = SCRIPT.read_text().split("<<'USAGE'", 1)[1].split("\nUSAGE\n", 1)[0]
    documented = (REPO / "docs" / "cli.md").read_text()
    missing = [
        flag for flag in sorted(set(re.findall(r"--[a-z][a-z0-9-]+", usage))) if flag not in documented
    ]
    assert missing == [], f"docs/cli.md does not describe onboard-node.sh's {missing}"


def _wheel(house: Path, name: str, version: str, requires: str = "") -> Path:
    """A real, installable wheel of one empty module, as pip builds them."""
    # A wheel spells its name with '_' for '-' (PEP 427).
    stem = f"{name.replace('-', '_')}-{version}"
    dist = f"{stem}.dist-info"
    files = {
        f"{stem.split('-')[0]}_module/__init__.py": b"",
        f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n{requires}".encode(),
        f"{dist}/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = [
        f"{path},sha256={base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b'=').decode()},{len(data)}"
        for path, data in files.items()
    ]
    files[f"{dist}/RECORD"] = ("\n".join([*record, f"{dist}/RECORD,,"]) + "\n").encode()
    path = house / f"{stem}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as archive:
        for member, data in files.items():
            archive.writestr(member, data)
    return path


@pytest.fixture
def real_pip_node(node: Node) -> Node:
    """The node with the real python3, so that `python3 -m venv` makes a real pip that reads no index."""
    (Path(node.env["STAND_INS"]) / "python3").unlink()
    return attrs.evolve(node, env={**node.env, "PIP_NO_INDEX": "1", "PIP_DISABLE_PIP_VERSION_CHECK": "1"})


@pytest.mark.slow
class TestWithRealPip:
    def test_a_wheelhouse_lacking_a_dependency_fails_in_pips_words_and_leaves_no_opt_llmgw(
        self, real_pip_node: Node, tmp_path: Path
    ) -> None:
        house = tmp_path / "wheels"
        house.mkdir()
        _wheel(house, "llmgw", __version__, "Requires-Dist: grpclib-stand-in\n")
        done = real_pip_node.onboard(*_ARGS, "--wheelhouse", str(house))
        assert done.returncode == 1
        assert "Could not find a version that satisfies the requirement grpclib-stand-in" in done.stderr
        assert f"llmgw {__version__} could not be installed on n1 from the wheelhouse" in done.stderr
        assert "removed the /opt/llmgw this install had begun on n1" in done.stderr
        assert not (real_pip_node.root / "opt/llmgw").exists()
        assert "installing on n1 failed (what it said is above)" in done.stderr

    def test_a_whole_wheelhouse_installs_llmgw_and_its_dependency_with_no_index(
        self, real_pip_node: Node, tmp_path: Path
    ) -> None:
        house = tmp_path / "wheels"
        house.mkdir()
        _wheel(house, "llmgw", __version__, "Requires-Dist: grpclib-stand-in\n")
        _wheel(house, "grpclib-stand-in", "0.4.7")
        done = real_pip_node.onboard(*_ARGS, "--wheelhouse", str(house))
        assert done.returncode == 0, done.stderr
        site = next((real_pip_node.root / "opt/llmgw/lib").glob("python3*/site-packages"))
        assert {p.name for p in site.glob("*.dist-info")} >= {
            f"llmgw-{__version__}.dist-info",
            "grpclib_stand_in-0.4.7.dist-info",
        }
