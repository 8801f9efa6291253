"""vLLM's locked wheels carried by a bundle, imported into a mirror and installed by a node's pip from it.

A real lock is gigabytes: these use a lock of one real wheel built here (tinyengine), put where
llmgw looks for vLLM's lock, and pip downloads it from a local find-links directory through pip's own
configuration (PIP_NO_INDEX, PIP_FIND_LINKS), as `bundle create` lets pip's configuration apply.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import shutil
from pathlib import Path

import attrs
import pytest
from click.testing import CliRunner

from llmgw.agent.discovery.host import Host
from llmgw.agent.provision.runner import SubprocessRunner
from llmgw.agent.provision.wheels import EnvInstall, WheelSource, install_env
from llmgw.bundle.create import CreateOptions, create_bundle, parse_engines
from llmgw.bundle.importing import ImportOptions, import_bundle
from llmgw.bundle.manifest import MANIFEST, BundleError, BundleWheelhouse
from llmgw.bundle.wheelhouse import download_argv
from llmgw.cli.bundle import bundle
from llmgw.config import MirrorConfig
from llmgw.engines import vllm
from llmgw.engines.base import Wheels
from llmgw.roles.mirror import mirror_role
from tests.agent.provision.test_wheels import tiny_wheel, write_lock
from tests.cli.test_server_init import _init

WHEEL = "tinyengine-1.0-py3-none-any.whl"
HOUSE = "engines/wheels/vllm/0.32.0-cpu"


@attrs.frozen
class Made:
    path: Path
    sha256: str
    lock: Path
    wheel: bytes


@pytest.fixture
def small_lock(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """vLLM 0.32.0's cpu lock replaced by one of tinyengine, whose wheel pip finds in a local directory."""
    wheel = tiny_wheel(tmp_path / "published")
    digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
    lock = write_lock(tmp_path / "vllm-0.32.0-cpu.txt", f"tinyengine==1.0 \\\n    --hash=sha256:{digest}\n")

    def find_lock(engine: str, version: str, variant: str) -> Path | None:
        return lock if (engine, version, variant) == ("vllm", "0.32.0", "cpu") else None

    monkeypatch.setattr(vllm, "find_lock", find_lock)
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(tmp_path / "published"))
    return lock


def _options(out: Path, tmp_path: Path, **changes: object) -> CreateOptions:
    wheelhouse = tmp_path / "llmgw-wheels"
    wheelhouse.mkdir(exist_ok=True)
    (wheelhouse / "llmgw-0.1.0-py3-none-any.whl").write_bytes(b"PK\x03\x04 llmgw")
    opts = CreateOptions(
        out=out, engines=(("vllm", "0.32.0"),), arches=("x64",), cpu_only=True, wheelhouse=wheelhouse
    )
    return attrs.evolve(opts, **changes)


@pytest.fixture
async def made(tmp_path: Path, small_lock: Path, monkeypatch: pytest.MonkeyPatch) -> Made:
    created = await create_bundle(_options(tmp_path / "bundle", tmp_path), lambda _: None)
    wheel = (tmp_path / "published" / WHEEL).read_bytes()
    # From here on, only the mirror has the wheel: a node's pip must not find it anywhere else.
    monkeypatch.delenv("PIP_NO_INDEX")
    monkeypatch.delenv("PIP_FIND_LINKS")
    await asyncio.to_thread(shutil.rmtree, tmp_path / "published")
    return Made(path=created.path, sha256=created.sha256, lock=small_lock, wheel=wheel)


def _import(made: Made, root: Path, **changes: object) -> ImportOptions:
    opts = ImportOptions(
        bundle=made.path,
        sha256=made.sha256,
        root=root,
        server_config=None,
        mirror_url="http://models.internal:8081",
        trust_dir=root.parent / "keys",
    )
    return attrs.evolve(opts, **changes)


class TestCreate:
    async def test_a_bundle_carries_every_wheel_of_the_lock_each_in_the_manifest(self, made: Made) -> None:
        manifest = json.loads((made.path / MANIFEST).read_bytes())
        (entry,) = [f for f in manifest["files"] if f["path"].startswith(HOUSE)]
        assert entry == {
            "path": f"{HOUSE}/{WHEEL}",
            "size": len(made.wheel),
            "sha256": hashlib.sha256(made.wheel).hexdigest(),
            "kind": "engine",
            "what": "vLLM 0.32.0 (cpu)",
        }
        assert manifest["wheelhouses"] == [
            {"engine": "vllm", "version": "0.32.0", "variant": "cpu", "machine": "amd64", "path": HOUSE}
        ]
        assert manifest["engines"] == []
        assert (made.path / HOUSE / WHEEL).read_bytes() == made.wheel

    async def test_a_published_wheel_that_differs_from_the_lock_is_never_carried(
        self, tmp_path: Path, small_lock: Path
    ) -> None:
        write_lock(small_lock, "tinyengine==1.0 \\\n    --hash=sha256:" + "0" * 64 + "\n")
        out = tmp_path / "bundle"
        with pytest.raises(BundleError, match=r"`pip download` failed(.|\n)*HASHES"):
            await create_bundle(_options(out, tmp_path), lambda _: None)
        assert not out.exists()
        assert not out.with_name("bundle.partial").exists()

    async def test_arm64_nodes_are_told_there_is_no_lock_for_them_and_x64_ones_still_get_theirs(
        self, tmp_path: Path, small_lock: Path
    ) -> None:
        seen: list[str] = []
        created = await create_bundle(
            _options(tmp_path / "b", tmp_path, arches=("x64", "arm64")), seen.append
        )
        assert created.manifest.wheelhouses[0].path == HOUSE
        assert (
            "vLLM 0.32.0: nothing to carry for arm64 nodes without an NVIDIA driver: its lock is for amd64"
            in seen
        )

    def test_a_version_llmgw_has_no_lock_of_is_refused_before_anything_is_downloaded(self) -> None:
        with pytest.raises(
            BundleError, match=r"llmgw has no lock of vLLM 0\.9 .* can install there: 0\.32\.0"
        ):
            parse_engines(["vllm=0.9"])
        assert parse_engines(["vllm=0.32.0"]) == (("vllm", "0.32.0"),)

    def test_pip_downloads_as_a_node_installs_from_the_index_given_or_from_pips_own_and_the_locks_extras(
        self,
    ) -> None:
        wheels = vllm.choose_wheels("0.32.0", Host(arch="amd64"))
        argv = download_argv(wheels, Path("/b"), "x64", "3.11", "")
        assert argv[:6] == [
            "download",
            "--require-hashes",
            "--no-deps",
            "--only-binary",
            ":all:",
            "--progress-bar",
        ]
        assert argv[7:11] == ["--python-version", "3.11", "--platform", "manylinux_2_28_x86_64"]
        assert argv[-2:] == ["--extra-index-url", vllm.TORCH_CPU_INDEX]
        assert "--index-url" not in argv
        own = download_argv(wheels, Path("/b"), "x64", "3.11", "https://pypi.internal/simple")
        assert own[-2:] == ["--index-url", "https://pypi.internal/simple"]
        assert "--extra-index-url" not in own


class TestImportAndInstall:
    async def test_a_tampered_wheel_is_refused_by_name_and_nothing_is_placed(
        self, made: Made, tmp_path: Path
    ) -> None:
        (made.path / HOUSE / WHEEL).write_bytes(b"x" * len(made.wheel))
        root = tmp_path / "mirror"
        with pytest.raises(BundleError) as refused:
            await asyncio.to_thread(import_bundle, _import(made, root), lambda _: None)
        assert f"{HOUSE}/{WHEEL} does not match the manifest" in str(refused.value)
        assert str(refused.value).endswith("nothing was imported")
        assert not root.exists()

    @pytest.mark.slow
    async def test_a_node_installs_the_engine_from_the_mirror_with_no_index(
        self, made: Made, tmp_path: Path
    ) -> None:
        root = tmp_path / "mirror"
        done = await asyncio.to_thread(import_bundle, _import(made, root), lambda _: None)
        assert (root / HOUSE / WHEEL).read_bytes() == made.wheel
        ((house, url),) = done.wheelhouse_urls()
        assert house == BundleWheelhouse("vllm", "0.32.0", "cpu", "amd64", HOUSE)
        assert url == f"http://models.internal:8081/files/{HOUSE}/"

        async with mirror_role(MirrorConfig(root=str(root), listen="127.0.0.1:0")) as mirror:
            served = await asyncio.to_thread(
                import_bundle, _import(made, root, mirror_url=mirror.url), lambda _: None
            )
            ((_, wheelhouse),) = served.wheelhouse_urls()
            job = EnvInstall(
                wheels=Wheels(variant="cpu", distribution="tinyengine", lock=made.lock, module="tinyengine"),
                directory=tmp_path / "node" / "vllm" / "0.32.0-cpu",
                label="vLLM 0.32.0 (cpu)",
                engine="vllm",
                version="0.32.0",
                arch="amd64",
            )
            seen: list[str] = []
            version = await install_env(
                SubprocessRunner(), job, WheelSource(wheelhouse=wheelhouse), seen.append
            )

        assert version == "tinyengine 1.0"
        assert await asyncio.to_thread((job.directory / "bin" / "python").is_file)
        assert "installing tinyengine and its packages with pip" in seen


class TestCommands:
    async def test_the_import_names_the_wheelhouse_url_a_nodes_agent_yaml_takes(
        self, made: Made, tmp_path: Path
    ) -> None:
        root = tmp_path / "mirror"
        args = ["import", str(made.path), "--sha256", made.sha256, "--root", str(root)]
        args += ["--trust-dir", str(tmp_path / "keys"), "--mirror-url", "http://models.internal:8081"]
        result = await asyncio.to_thread(CliRunner().invoke, bundle, args, catch_exceptions=False)
        assert result.exit_code == 0, result.stderr
        assert "  engine vllm 0.32.0 (cpu) for amd64: the wheels of its lock\n" in result.stdout
        assert result.stdout.endswith(
            "nodes install vllm 0.32.0 (cpu) from the mirror with agent.yaml "
            f"`engines.vllm.wheelhouse: http://models.internal:8081/files/{HOUSE}/`\n"
        )

    async def test_server_init_with_such_a_bundle_says_what_the_nodes_need(
        self, made: Made, tmp_path: Path
    ) -> None:
        root = tmp_path / "machine"
        code, stdout, _ = await asyncio.to_thread(
            _init, root, "--bundle", str(made.path), "--sha256", made.sha256
        )
        assert code == 0, stdout
        assert (root / "var/lib/llmgw-mirror" / HOUSE / WHEEL).read_bytes() == made.wheel
        assert (
            "ok    vllm 0.32.0 (cpu)'s wheels in the mirror: nodes install it with agent.yaml "
            f"`engines.vllm.wheelhouse: http://10.0.0.140:8081/files/{HOUSE}/`"
        ) in stdout
