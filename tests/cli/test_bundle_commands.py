"""`llmgw bundle` and `llmgw server init --bundle`: what they print, what they refuse."""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner

from llmgw.bundle.manifest import FORMAT, MANIFEST, BundleEngine, BundleFile, Manifest, digest
from llmgw.cli.bundle import bundle
from llmgw.cli.exit import EXIT_ERROR
from tests.cli.test_server_init import _init

ASSET = "llama-b1-bin-ubuntu-x64.tar.gz"
ARCHIVE = b"an archive as the publisher published it"


def _run(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(bundle, list(args), catch_exceptions=False)
    return result.exit_code, result.stdout, result.stderr


def _wheels_only(tmp_path: Path) -> tuple[Path, str]:
    """A bundle of a wheelhouse alone, made by the command (no publisher to ask); its manifest's sha256."""
    wheelhouse = tmp_path / "wheelhouse"
    wheelhouse.mkdir()
    (wheelhouse / "llmgw-0.1.0-py3-none-any.whl").write_bytes(b"PK wheel")
    out = tmp_path / "bundle"
    code, stdout, _ = _run("create", str(out), "--wheelhouse", str(wheelhouse), "--arch", "x64")
    assert code == 0
    assert stdout.startswith(f"bundle {out}: 1 files")
    sha = stdout.splitlines()[-1].removeprefix("manifest sha256: ")
    assert sha == digest((out / MANIFEST).read_bytes())
    return out, sha


def _with_engine(tmp_path: Path) -> tuple[Path, str]:
    """A bundle carrying one llama.cpp archive, as `bundle create` lays it out."""
    out = tmp_path / "engine-bundle"
    path = f"engines/ggml-org/llama.cpp/releases/download/b1/{ASSET}"
    (out / path).parent.mkdir(parents=True)
    (out / path).write_bytes(ARCHIVE)
    manifest = Manifest(
        format=FORMAT,
        llmgw_version="0.1.0",
        created="2026-12-01T00:00:00+00:00",
        files=(BundleFile(path=path, size=len(ARCHIVE), sha256=digest(ARCHIVE), kind="engine"),),
        engines=(
            BundleEngine(
                engine="llamacpp",
                repo="ggml-org/llama.cpp",
                version="b1",
                arch=("x64",),
                digests={ASSET: digest(ARCHIVE)},
            ),
        ),
    )
    data = manifest.to_bytes()
    (out / MANIFEST).write_bytes(data)
    return out, digest(data)


class TestBundleCommands:
    def test_the_sha256_create_prints_is_the_one_import_takes(self, tmp_path: Path) -> None:
        out, sha = _wheels_only(tmp_path)
        root = tmp_path / "mirror"
        code, stdout, _ = _run(
            "import", str(out), "--sha256", sha, "--root", str(root), "--trust-dir", str(tmp_path / "keys")
        )
        assert code == 0
        assert stdout == f"imported {out} (unsigned): 1 files, 8.0 B\n"

    def test_a_wrong_sha256_exits_1_and_says_which_manifest(self, tmp_path: Path) -> None:
        out, sha = _wheels_only(tmp_path)
        root = tmp_path / "mirror"
        code, _, stderr = _run(
            "import", str(out), "--sha256", "f" * 64, "--root", str(root), "--trust-dir", str(tmp_path / "k")
        )
        assert code == EXIT_ERROR
        assert f"llmgw: {out}: manifest.json has sha256 {sha}, not the {'f' * 64}" in stderr
        assert not root.exists()

    def test_a_key_made_signs_a_bundle_that_imports_once_trusted_and_not_once_removed(
        self, tmp_path: Path
    ) -> None:
        out, sha = _wheels_only(tmp_path)
        key, keys = tmp_path / "team", tmp_path / "keys"
        code, stdout, _ = _run("keygen", str(key))
        assert code == 0 and "SHA256:" in stdout and (key.stat().st_mode & 0o777) == 0o600
        assert _run("sign", str(out), "--key", str(key))[0] == 0
        code, stdout, _ = _run("trust", "add", f"{key}.pub", "--trust-dir", str(keys))
        assert code == 0 and stdout.startswith("trusted team (SHA256:")
        assert _run("trust", "list", "--trust-dir", str(keys))[1].startswith("team  SHA256:")
        args = ["import", str(out), "--sha256", sha, "--root", str(tmp_path / "m"), "--trust-dir", str(keys)]
        code, stdout, _ = _run(*args)
        assert code == 0 and "(signed by team)" in stdout
        assert _run("trust", "rm", "team", "--trust-dir", str(keys))[0] == 0
        code, _, stderr = _run(*args)
        assert code == EXIT_ERROR and "a key this machine does not trust" in stderr

    def test_engines_that_llmgw_does_not_install_are_refused_before_anything_is_asked(
        self, tmp_path: Path
    ) -> None:
        code, _, stderr = _run("create", str(tmp_path / "b"), "--engines", "sglang=0.5")
        assert code == EXIT_ERROR
        assert "sglang is installed by hand and has nothing to bundle" in stderr
        assert not (tmp_path / "b").exists()
        code, _, stderr = _run("create", str(tmp_path / "b"), "--engines", "vllm=0.9")
        assert code == EXIT_ERROR
        assert "llmgw has no lock of vLLM 0.9 for a node with no NVIDIA driver (cpu)" in stderr
        assert not (tmp_path / "b").exists()


class TestServerInitWithABundle:
    def test_init_fills_the_mirror_and_points_engine_mirror_at_this_machine(self, tmp_path: Path) -> None:
        out, sha = _with_engine(tmp_path)
        root = tmp_path / "machine"
        code, stdout, _ = _init(root, "--bundle", str(out), "--sha256", sha)
        assert code == 0, stdout
        assert f"ok    bundle {out.absolute()}: 0 models and 1 engine releases" in stdout
        assert "ok    engine_mirror in" in stdout and "http://10.0.0.140:8081/files/engines" in stdout
        placed = root / "var/lib/llmgw-mirror/engines/ggml-org/llama.cpp/releases/download/b1" / ASSET
        assert placed.read_bytes() == ARCHIVE
        text = (root / "etc/llmgw/server.yaml").read_text()
        assert f"{ASSET}: sha256:{digest(ARCHIVE)}" in text

    def test_the_mirror_url_names_the_first_host_given_rather_than_the_address(self, tmp_path: Path) -> None:
        out, sha = _with_engine(tmp_path)
        code, stdout, _ = _init(
            tmp_path / "machine", "--host", "llmgw.example.com", "--bundle", str(out), "--sha256", sha
        )
        assert code == 0, stdout
        assert "http://llmgw.example.com:8081/files/engines" in stdout

    def test_a_bundle_that_does_not_match_is_refused_and_nothing_is_placed(self, tmp_path: Path) -> None:
        out, sha = _with_engine(tmp_path)
        (out / f"engines/ggml-org/llama.cpp/releases/download/b1/{ASSET}").write_bytes(b"x" * len(ARCHIVE))
        root = tmp_path / "machine"
        code, _, stderr = _init(root, "--bundle", str(out), "--sha256", sha)
        assert code == EXIT_ERROR
        assert f"{ASSET} does not match the manifest" in stderr
        assert not (root / "var/lib/llmgw-mirror").exists()
        assert "engine_mirror" not in (root / "etc/llmgw/server.yaml").read_text()

    def test_a_bundle_without_its_sha256_is_refused(self, tmp_path: Path) -> None:
        out, _ = _with_engine(tmp_path)
        code, _, stderr = _init(tmp_path / "machine", "--bundle", str(out))
        assert code == EXIT_ERROR and "--bundle needs --sha256" in stderr
