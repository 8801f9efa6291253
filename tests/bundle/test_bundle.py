"""Offline bundles made from a fake hub and a fake release server on loopback, then checked and imported."""

from __future__ import annotations

import asyncio
import hashlib
import io
import json
import os
import re
import sys
import tarfile
from collections.abc import AsyncIterator
from pathlib import Path

import attrs
import pytest
from aiohttp import web

from llmgw import __version__
from llmgw.bundle import signing
from llmgw.bundle.create import CreateOptions, create_bundle, default_llmgw_spec, parse_arches, parse_engines
from llmgw.bundle.importing import Imported, ImportOptions, import_bundle, node_packages
from llmgw.bundle.manifest import MANIFEST, SIGNATURE, BundleError, digest, parse
from llmgw.installed import Origin
from llmgw.mirror.fetch import MANIFEST as PINS
from llmgw.mirror.fetch import list_models, read_model
from tests.agent.provision.conftest import CPU_ASSET, FakeRelease, sha256
from tests.mirror.test_fetch import COMMIT, WEIGHTS, Hub, hub  # noqa: F401
from tests.waiting import eventually

WHEEL = "llmgw-0.1.0-py3-none-any.whl"
SERVER_YAML = """\
# The control plane of the plant floor: kept as written.
listen: 127.0.0.1:0
engines:
  llamacpp: b1
"""


@attrs.frozen
class Made:
    path: Path
    sha256: str
    hub: Hub
    release: FakeRelease


@pytest.fixture
async def release() -> AsyncIterator[FakeRelease]:
    fake = FakeRelease()
    runner = web.AppRunner(fake.app(), access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    fake.url = f"http://127.0.0.1:{runner.addresses[0][1]}"
    yield fake
    await runner.cleanup()


@pytest.fixture
def wheelhouse(tmp_path: Path) -> Path:
    directory = tmp_path / "wheelhouse"
    directory.mkdir()
    (directory / WHEEL).write_bytes(b"PK\x03\x04 llmgw")
    (directory / "attrs-25.1.0-py3-none-any.whl").write_bytes(b"PK\x03\x04 attrs")
    return directory


def _options(
    out: Path,
    hub: Hub,  # noqa: F811
    release: FakeRelease,
    wheelhouse: Path,
    **changes: object,
) -> CreateOptions:
    opts = CreateOptions(
        out=out,
        models=("org/model@main",),
        engines=(("llamacpp", "b1"),),
        arches=("x64",),
        cpu_only=True,
        wheelhouse=wheelhouse,
        hf_endpoint=hub.url,
        release_api=release.url,
        release_download=release.url,
    )
    return attrs.evolve(opts, **changes)


async def _make(
    tmp_path: Path,
    hub: Hub,  # noqa: F811
    release: FakeRelease,
    wheelhouse: Path,
    **changes: object,
) -> Made:
    out = tmp_path / ("bundle.tar" if changes.get("tar") else "bundle")
    created = await create_bundle(_options(out, hub, release, wheelhouse, **changes), lambda _: None)
    return Made(path=created.path, sha256=created.sha256, hub=hub, release=release)


@pytest.fixture
async def made(
    tmp_path: Path,
    hub: Hub,  # noqa: F811
    release: FakeRelease,
    wheelhouse: Path,
) -> Made:
    return await _make(tmp_path, hub, release, wheelhouse)


@attrs.frozen
class Site:
    root: Path
    server_yaml: Path
    trust_dir: Path

    def options(self, bundle: Path, sha: str, **changes: object) -> ImportOptions:
        opts = ImportOptions(
            bundle=bundle,
            sha256=sha,
            root=self.root,
            server_config=self.server_yaml,
            mirror_url="http://models.internal:8081",
            trust_dir=self.trust_dir,
        )
        return attrs.evolve(opts, **changes)

    async def load(self, bundle: Path, sha: str, **changes: object) -> Imported:
        return await asyncio.to_thread(import_bundle, self.options(bundle, sha, **changes), lambda _: None)

    def untouched(self) -> None:
        """Nothing was imported: no file in the mirror's root (not even staging), server.yaml as it was."""
        left = (
            sorted(p.relative_to(self.root).as_posix() for p in self.root.rglob("*"))
            if self.root.exists()
            else []
        )
        assert left == []
        assert self.server_yaml.read_text() == SERVER_YAML


@pytest.fixture
def site(tmp_path: Path) -> Site:
    server_yaml = tmp_path / "site" / "server.yaml"
    server_yaml.parent.mkdir()
    server_yaml.write_text(SERVER_YAML)
    return Site(
        root=tmp_path / "site" / "mirror", server_yaml=server_yaml, trust_dir=tmp_path / "site" / "keys"
    )


def _files(directory: Path) -> list[str]:
    return sorted(p.relative_to(directory).as_posix() for p in directory.rglob("*") if p.is_file())


ENGINE_PATH = f"engines/ggml-org/llama.cpp/releases/download/b1/{CPU_ASSET}"
MODEL_DIR = f"models/org/model/{COMMIT}"


class TestCreate:
    async def test_a_bundle_holds_the_wheels_the_archives_and_the_pinned_models_with_a_manifest_of_each(
        self, made: Made
    ) -> None:
        assert _files(made.path) == [
            ENGINE_PATH,
            MANIFEST,
            f"{MODEL_DIR}/{PINS}",
            f"{MODEL_DIR}/config.json",
            f"{MODEL_DIR}/model.safetensors",
            f"{MODEL_DIR}/tokenizer/tokenizer.json",
            "wheels/attrs-25.1.0-py3-none-any.whl",
            f"wheels/{WHEEL}",
        ]
        data = (made.path / MANIFEST).read_bytes()
        assert digest(data) == made.sha256
        manifest = json.loads(data)
        listed = {f["path"]: f for f in manifest["files"]}
        assert set(listed) == set(_files(made.path)) - {MANIFEST}
        weights = listed[f"{MODEL_DIR}/model.safetensors"]
        assert (weights["size"], weights["sha256"], weights["kind"]) == (
            len(WEIGHTS),
            hashlib.sha256(WEIGHTS).hexdigest(),
            "model",
        )
        assert listed[ENGINE_PATH]["what"] == "llamacpp b1 for x64"
        (engine,) = manifest["engines"]
        assert engine["digests"] == {CPU_ASSET: sha256(made.release.assets[CPU_ASSET])}
        assert manifest["models"] == [{"repo": "org/model", "revision": "main", "commit": COMMIT}]
        assert not (made.path.parent / "bundle.partial").exists()

    async def test_every_architecture_gets_its_cpu_build_and_x64_its_cuda_build_too(
        self,
        tmp_path: Path,
        hub: Hub,  # noqa: F811
        release: FakeRelease,
        wheelhouse: Path,
    ) -> None:
        for name in (
            "llama-b1-bin-ubuntu-arm64.tar.gz",
            "llama-b1-bin-ubuntu-cuda-12.8-x64.tar.gz",
            "cudart-llama-b1-bin-ubuntu-cuda-12.8-x64.tar.gz",
        ):
            release.assets[name] = name.encode()
            release.digests[name] = f"sha256:{sha256(name.encode())}"
        made = await _make(
            tmp_path, hub, release, wheelhouse, arches=("x64", "arm64"), cpu_only=False, models=()
        )
        held = {p.rsplit("/", 1)[1] for p in _files(made.path) if p.startswith("engines/")}
        assert held == {CPU_ASSET, *(n for n in release.assets if n != CPU_ASSET)}

    async def test_an_archive_the_publisher_gives_no_digest_for_is_not_bundled(
        self,
        tmp_path: Path,
        hub: Hub,  # noqa: F811
        release: FakeRelease,
        wheelhouse: Path,
    ) -> None:
        del release.digests[CPU_ASSET]
        with pytest.raises(BundleError, match=f"the publisher gives no sha256 for {CPU_ASSET}"):
            await _make(tmp_path, hub, release, wheelhouse)
        assert not (tmp_path / "bundle").exists() and not (tmp_path / "bundle.partial").exists()

    async def test_an_archive_that_does_not_match_the_publishers_digest_is_refused(
        self,
        tmp_path: Path,
        hub: Hub,  # noqa: F811
        release: FakeRelease,
        wheelhouse: Path,
    ) -> None:
        release.assets[CPU_ASSET] = b"not the archive that was published"
        with pytest.raises(BundleError, match=f"{CPU_ASSET}: sha256 does not match the publisher's"):
            await _make(tmp_path, hub, release, wheelhouse)
        assert not (tmp_path / "bundle").exists()

    async def test_a_wheelhouse_without_llmgws_own_wheel_is_refused(
        self,
        tmp_path: Path,
        hub: Hub,  # noqa: F811
        release: FakeRelease,
        wheelhouse: Path,
    ) -> None:
        (wheelhouse / WHEEL).unlink()
        with pytest.raises(BundleError, match="gave no llmgw wheel"):
            await _make(tmp_path, hub, release, wheelhouse)

    async def test_a_version_on_no_index_says_to_give_llmgw_with_llmgw_path(
        self,
        tmp_path: Path,
        hub: Hub,  # noqa: F811
        release: FakeRelease,
        wheelhouse: Path,
        monkeypatch: pytest.MonkeyPatch,
    ) -> None:
        """Real pip, asked for llmgw==VERSION of an index that has none (as PyPI has no checkout's)."""
        index = tmp_path / "empty-index"
        index.mkdir()
        monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
        monkeypatch.setenv("PIP_INDEX_URL", index.as_uri())
        monkeypatch.delenv("PIP_FIND_LINKS", raising=False)
        spec = f"llmgw=={__version__}"
        with pytest.raises(BundleError) as refused:
            opts = _options(tmp_path / "bundle", hub, release, wheelhouse)
            await create_bundle(attrs.evolve(opts, wheelhouse=None, llmgw_spec=spec), lambda _: None)
        said = str(refused.value)
        assert f"satisfies the requirement {spec}" in said
        assert said.endswith(
            f"{spec} is on no package index pip reached: give llmgw's wheel or source directory with "
            f"--llmgw PATH (--llmgw dist/llmgw-{__version__}-py3-none-any.whl, or --llmgw . in a checkout)"
        )

    def test_without_llmgw_a_checkout_or_the_wheel_installed_from_is_built_rather_than_a_version_pin(
        self, tmp_path: Path
    ) -> None:
        wheel = tmp_path / f"llmgw-{__version__}-py3-none-any.whl"
        wheel.write_bytes(b"PK")
        assert default_llmgw_spec(Origin(checkout=tmp_path)) == str(tmp_path)
        assert default_llmgw_spec(Origin(wheel=wheel)) == str(wheel)
        # A wheel since deleted, or a release from an index: the index is asked for the version.
        assert default_llmgw_spec(Origin(wheel=tmp_path / "gone.whl")) == f"llmgw=={__version__}"
        assert default_llmgw_spec(Origin()) == f"llmgw=={__version__}"

    async def test_an_existing_path_is_never_written_over(self, made: Made, wheelhouse: Path) -> None:
        with pytest.raises(BundleError, match="exists; a bundle is made into a new path"):
            await _make(made.path.parent, made.hub, made.release, wheelhouse)

    def test_engines_and_architectures_are_refused_in_words(self) -> None:
        with pytest.raises(BundleError, match="write ENGINE=VERSION"):
            parse_engines(["llamacpp"])
        with pytest.raises(BundleError, match=re.escape("'../b1' is not a release tag")):
            parse_engines(["llamacpp=../b1"])
        with pytest.raises(BundleError, match="sglang is installed by hand"):
            parse_engines(["sglang=0.5"])
        with pytest.raises(BundleError, match=r"llmgw has no lock of vLLM 0\.9"):
            parse_engines(["vllm=0.9"])
        with pytest.raises(BundleError, match="name some of x64, arm64"):
            parse_arches("x64,riscv")


class TestImport:
    async def test_a_tar_bundle_fills_the_mirror_and_points_server_yaml_at_its_engines(
        self,
        tmp_path: Path,
        hub: Hub,  # noqa: F811
        release: FakeRelease,
        wheelhouse: Path,
        site: Site,
    ) -> None:
        made = await _make(tmp_path, hub, release, wheelhouse, tar=True)
        with tarfile.open(made.path) as tar:
            assert tar.getnames()[0] == MANIFEST
        done = await site.load(made.path, made.sha256)
        assert done.signer is None
        assert (site.root / ENGINE_PATH).read_bytes() == release.assets[CPU_ASSET]
        model = await asyncio.to_thread(read_model, site.root / "org" / "model" / COMMIT)
        assert model is not None and model.pins()["model.safetensors"] == hashlib.sha256(WEIGHTS).hexdigest()
        assert (site.root / "org" / "model" / COMMIT / "model.safetensors").read_bytes() == WEIGHTS
        assert not (site.root / ".incoming").exists()
        text = site.server_yaml.read_text()
        assert text.startswith("# The control plane of the plant floor: kept as written.\n")
        assert "base_url: http://models.internal:8081/files/engines" in text
        assert f"{CPU_ASSET}: sha256:{sha256(release.assets[CPU_ASSET])}" in text

    async def test_a_directory_bundle_imports_the_same_and_again_without_harm(
        self, made: Made, site: Site
    ) -> None:
        await site.load(made.path, made.sha256)
        first = _files(site.root)
        await site.load(made.path, made.sha256)
        assert _files(site.root) == first
        assert site.server_yaml.read_text().count("base_url:") == 1

    async def test_without_a_mirror_url_anywhere_nothing_is_imported(self, made: Made, site: Site) -> None:
        with pytest.raises(BundleError, match="give it with --mirror-url"):
            await site.load(made.path, made.sha256, mirror_url="")
        site.untouched()

    async def test_the_os_packages_the_carried_engines_need_are_named_for_each_family(
        self, made: Made
    ) -> None:
        """An offline node still ran `apt-get install libgomp1`: no bundle carries OS packages."""
        manifest = parse((made.path / MANIFEST).read_bytes(), "test")
        assert node_packages(manifest) == ["libgomp1 (Debian, Ubuntu)", "libgomp (RHEL, Rocky, Fedora)"]
        assert node_packages(attrs.evolve(manifest, engines=())) == []


class TestRefusals:
    """Every refusal names what is wrong, and leaves the mirror and server.yaml as they were."""

    async def test_a_manifest_that_is_not_the_one_handed_over_is_refused(
        self, made: Made, site: Site
    ) -> None:
        with pytest.raises(BundleError, match=f"{MANIFEST} has sha256 {made.sha256}, not the 0+ given"):
            await site.load(made.path, "0" * 64)
        site.untouched()

    async def test_a_mirror_root_that_cannot_be_made_is_refused_in_words(
        self, made: Made, site: Site, tmp_path: Path
    ) -> None:
        (tmp_path / "a-file").write_text("")
        with pytest.raises(
            BundleError, match=r"cannot stage the bundle in the mirror's root: .*a-file/mirror"
        ):
            await site.load(made.path, made.sha256, root=tmp_path / "a-file" / "mirror")
        assert site.server_yaml.read_text() == SERVER_YAML

    async def test_a_malformed_sha256_is_refused(self, made: Made, site: Site) -> None:
        with pytest.raises(BundleError, match="is not a sha256"):
            await site.load(made.path, "abc")
        site.untouched()

    async def test_a_changed_file_is_refused_naming_it(self, made: Made, site: Site) -> None:
        weights = made.path / MODEL_DIR / "model.safetensors"
        weights.write_bytes(b"\xff" + WEIGHTS[1:])
        with pytest.raises(BundleError, match=f"{MODEL_DIR}/model.safetensors does not match the manifest"):
            await site.load(made.path, made.sha256)
        site.untouched()

    async def test_a_file_of_another_size_is_refused_naming_it(self, made: Made, site: Site) -> None:
        (made.path / ENGINE_PATH).write_bytes(b"short")
        with pytest.raises(BundleError, match=f"{ENGINE_PATH} is 5 bytes where the manifest says"):
            await site.load(made.path, made.sha256)
        site.untouched()

    async def test_a_missing_file_is_refused_naming_it(self, made: Made, site: Site) -> None:
        (made.path / "wheels" / WHEEL).unlink()
        with pytest.raises(BundleError, match=f"wheels/{WHEEL} is missing; nothing was imported"):
            await site.load(made.path, made.sha256)
        site.untouched()

    async def test_a_directory_without_a_manifest_is_refused(self, made: Made, site: Site) -> None:
        (made.path / MANIFEST).unlink()
        with pytest.raises(BundleError, match=f"has no {MANIFEST}"):
            await site.load(made.path, made.sha256)
        site.untouched()

    @pytest.mark.parametrize("keep", [0.3, 0.6, 0.95])
    async def test_a_truncated_tar_is_refused_naming_where_it_ends(
        self,
        keep: float,
        tmp_path: Path,
        hub: Hub,  # noqa: F811
        release: FakeRelease,
        wheelhouse: Path,
        site: Site,
    ) -> None:
        made = await _make(tmp_path, hub, release, wheelhouse, tar=True)
        data = made.path.read_bytes()
        made.path.write_bytes(data[: int(len(data) * keep)])
        with pytest.raises(BundleError, match=r"the tar is truncated: it ends inside \S+|\S+ is missing"):
            await site.load(made.path, made.sha256)
        site.untouched()

    @pytest.mark.parametrize(
        ("name", "link"),
        [
            ("../../escaped", None),
            ("/etc/cron.d/evil", None),
            ("models/a/../../../x", None),
            ("wheels/x", "/etc"),
            # Siblings whose names start with the staging directory's or the mirror's.
            ("../staging-evil/cron", None),
            ("../mirror-evil/cron", None),
            ("wheels/x", "../../staging-evil"),
        ],
    )
    async def test_a_tar_member_outside_the_bundle_or_a_link_is_refused(
        self, name: str, link: str | None, made: Made, site: Site, tmp_path: Path
    ) -> None:
        bad = tmp_path / "bad.tar"
        with tarfile.open(bad, "w") as tar:
            tar.add(made.path / MANIFEST, arcname=MANIFEST)
            info = tarfile.TarInfo(name)
            if link is not None:
                info.type, info.linkname = tarfile.SYMTYPE, link
                tar.addfile(info)
            else:
                info.size = 4
                tar.addfile(info, io.BytesIO(b"evil"))
        with pytest.raises(BundleError, match=r"not a relative path|not a plain path|is a link or a device"):
            await site.load(bad, made.sha256)
        site.untouched()
        assert not (tmp_path / "escaped").exists()
        assert not await asyncio.to_thread(lambda: list(tmp_path.rglob("*-evil")))

    @pytest.mark.parametrize(
        ("first", "then", "why"),
        [
            (MANIFEST, "wheels/extra.whl", "which manifest.json does not list"),
            ("wheels/extra.whl", MANIFEST, "the tar begins with wheels/extra.whl, not manifest.json"),
            (MANIFEST, f"wheels/{WHEEL}", f"wheels/{WHEEL} is 4 bytes where the manifest says"),
        ],
    )
    async def test_a_tar_member_the_manifest_does_not_list_as_it_is_is_refused_before_it_is_unpacked(
        self, first: str, then: str, why: str, made: Made, site: Site, tmp_path: Path
    ) -> None:
        bad = tmp_path / "bad.tar"
        with tarfile.open(bad, "w") as tar:
            for name in (first, then):
                if name == MANIFEST:
                    tar.add(made.path / MANIFEST, arcname=MANIFEST)
                else:
                    info = tarfile.TarInfo(name)
                    info.size = 4
                    tar.addfile(info, io.BytesIO(b"junk"))
        with pytest.raises(BundleError, match=re.escape(why)):
            await site.load(bad, made.sha256)
        site.untouched()

    async def test_pins_that_do_not_match_the_manifest_are_refused(self, made: Made, site: Site) -> None:
        pins_path = made.path / MODEL_DIR / PINS
        pins = json.loads(pins_path.read_text())
        pins["files"][0]["sha256"] = "0" * 64
        pins_path.write_text(json.dumps(pins))
        manifest = json.loads((made.path / MANIFEST).read_text())
        for f in manifest["files"]:
            if f["path"] == f"{MODEL_DIR}/{PINS}":
                f["sha256"], f["size"] = digest(pins_path.read_bytes()), pins_path.stat().st_size
        data = json.dumps(manifest).encode()
        (made.path / MANIFEST).write_bytes(data)
        with pytest.raises(BundleError, match="does not match its pin"):
            await site.load(made.path, digest(data))
        site.untouched()


async def _sign(bundle: Path, key: Path) -> None:
    await asyncio.to_thread(lambda: signing.sign_bundle(bundle, signing.load_private(key)))


class TestSigning:
    @pytest.fixture
    def key(self, tmp_path: Path) -> Path:
        path = tmp_path / "release-team"
        signing.generate(path)
        return path

    async def test_a_bundle_signed_by_a_trusted_key_is_imported_saying_who_signed_it(
        self, made: Made, site: Site, key: Path
    ) -> None:
        await _sign(made.path, key)
        await asyncio.to_thread(signing.trust, site.trust_dir, key.with_name(key.name + ".pub"), None)
        done = await site.load(made.path, made.sha256)
        assert done.signer == "release-team"

    async def test_a_signed_tar_keeps_its_manifest_sha256_and_is_imported(
        self,
        tmp_path: Path,
        hub: Hub,  # noqa: F811
        release: FakeRelease,
        wheelhouse: Path,
        site: Site,
        key: Path,
    ) -> None:
        made = await _make(tmp_path, hub, release, wheelhouse, tar=True)
        await _sign(made.path, key)
        await asyncio.to_thread(signing.trust, site.trust_dir, key.with_name(key.name + ".pub"), "team")
        with pytest.raises(BundleError, match="is already signed"):
            await _sign(made.path, key)
        assert (await site.load(made.path, made.sha256)).signer == "team"

    async def test_an_unknown_signer_is_refused_with_its_fingerprint(
        self, made: Made, site: Site, key: Path, tmp_path: Path
    ) -> None:
        await _sign(made.path, key)
        other = tmp_path / "someone-else"
        await asyncio.to_thread(lambda: signing.trust(site.trust_dir, signing.generate(other), None))
        public = await asyncio.to_thread(signing.load_public, key.with_name(key.name + ".pub"))
        fingerprint = signing.fingerprint(public)
        with pytest.raises(
            BundleError, match=re.escape(f"signed by {fingerprint}, a key this machine does not trust")
        ):
            await site.load(made.path, made.sha256)
        site.untouched()

    async def test_a_signed_bundle_is_refused_where_no_key_is_trusted(
        self, made: Made, site: Site, key: Path
    ) -> None:
        await _sign(made.path, key)
        with pytest.raises(BundleError, match="a key this machine does not trust"):
            await site.load(made.path, made.sha256)
        site.untouched()

    async def test_an_unsigned_bundle_is_refused_where_keys_are_trusted_unless_allowed(
        self, made: Made, site: Site, key: Path
    ) -> None:
        await asyncio.to_thread(signing.trust, site.trust_dir, key.with_name(key.name + ".pub"), None)
        with pytest.raises(BundleError, match=r"the bundle is not signed.*--allow-unsigned"):
            await site.load(made.path, made.sha256)
        site.untouched()
        assert (await site.load(made.path, made.sha256, allow_unsigned=True)).signer is None

    async def test_a_signature_over_another_manifest_is_refused(
        self, made: Made, site: Site, key: Path
    ) -> None:
        await asyncio.to_thread(signing.trust, site.trust_dir, key.with_name(key.name + ".pub"), None)
        private = await asyncio.to_thread(signing.load_private, key)
        (made.path / SIGNATURE).write_bytes(signing.signature_for(b"another manifest", private))
        with pytest.raises(BundleError, match="does not verify against the manifest"):
            await site.load(made.path, made.sha256)
        site.untouched()

    def test_keys_are_never_overwritten_and_trust_is_listed_and_removed(
        self, key: Path, tmp_path: Path
    ) -> None:
        with pytest.raises(BundleError, match="exists; a key is never overwritten"):
            signing.generate(key)
        trust_dir = tmp_path / "trust"
        added = signing.trust(trust_dir, key.with_name(key.name + ".pub"), None)
        with pytest.raises(BundleError, match="is already trusted, as release-team"):
            signing.trust(trust_dir, key.with_name(key.name + ".pub"), "again")
        assert [k.fingerprint for k in signing.trusted_keys(trust_dir)] == [added.fingerprint]
        signing.distrust(trust_dir, "release-team")
        assert signing.trusted_keys(trust_dir) == []
        with pytest.raises(BundleError, match="no trusted key is named 'release-team' \\(trusted: none\\)"):
            signing.distrust(trust_dir, "release-team")


class TestKilled:
    async def test_an_import_killed_midway_leaves_no_model_served_and_server_yaml_whole(
        self,
        tmp_path: Path,
        hub: Hub,  # noqa: F811
        release: FakeRelease,
        wheelhouse: Path,
        site: Site,
    ) -> None:
        # Big enough that the import is still copying it when the kill lands.
        hub.files["model.safetensors"] = bytes(range(256)) * (1 << 18)  # 64 MiB
        made = await _make(tmp_path, hub, release, wheelhouse, tar=True)
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "llmgw",
            "bundle",
            "import",
            str(made.path),
            "--sha256",
            made.sha256,
            "--root",
            str(site.root),
            "--server-config",
            str(site.server_yaml),
            "--mirror-url",
            "http://models.internal:8081",
            "--trust-dir",
            str(site.trust_dir),
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL,
        )
        staged = site.root / ".incoming"

        def copying() -> bool:
            return any(p.name == "model.safetensors" for p in staged.rglob("*")) if staged.exists() else False

        try:
            await eventually(lambda: process.returncode is not None or copying(), within_s=60)
        finally:
            if process.returncode is None:
                process.kill()
            await process.wait()
        # Killed while staging: the mirror serves nothing of it, and server.yaml is as it was.
        served = [p for p in site.root.rglob("*") if not p.relative_to(site.root).parts[0].startswith(".")]
        assert served == []
        assert await asyncio.to_thread(list_models, site.root) == []
        assert site.server_yaml.read_text() == SERVER_YAML
        # The next import does it all, the abandoned staging left unserved.
        await site.load(made.path, made.sha256)
        assert [m.commit for m in await asyncio.to_thread(list_models, site.root)] == [COMMIT]
        assert "base_url: http://models.internal:8081/files/engines" in site.server_yaml.read_text()
