"""Unpacking release archives without letting them write anywhere else."""

from __future__ import annotations

import io
import os
import stat
import tarfile
from pathlib import Path
from typing import Any

import pytest

from llmgw.agent.provision.archive import ArchiveFormatError, UnsafeArchiveError, unpack


def write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


class TestTarGz:
    def test_files_modes_and_library_symlinks_are_kept(self, tmp_path: Path, kit: Any) -> None:
        archive = write(tmp_path / "a.tar.gz", kit.llama_cpu_archive())
        dest = tmp_path / "out"
        dest.mkdir()

        unpack(archive, dest)

        server = dest / "llama-b1" / "llama-server"
        assert server.read_text().startswith("#!/bin/sh")
        assert os.access(server, os.X_OK)
        assert os.readlink(dest / "llama-b1" / "libllama.so") == "libllama.so.0"

    def test_devices_fifos_and_hard_links_are_skipped(self, tmp_path: Path) -> None:
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w:gz") as tar:
            body = tarfile.TarInfo("bin/llama-server")
            body.size = 2
            tar.addfile(body, io.BytesIO(b"hi"))
            fifo = tarfile.TarInfo("bin/pipe")
            fifo.type = tarfile.FIFOTYPE
            tar.addfile(fifo)
            dev = tarfile.TarInfo("bin/null")
            dev.type, dev.devmajor, dev.devminor = tarfile.CHRTYPE, 1, 3
            tar.addfile(dev)
            hard = tarfile.TarInfo("bin/passwd")
            hard.type, hard.linkname = tarfile.LNKTYPE, "/etc/passwd"
            tar.addfile(hard)
        dest = tmp_path / "out"
        dest.mkdir()

        unpack(write(tmp_path / "a.tar.gz", buf.getvalue()), dest)

        assert sorted(os.listdir(dest / "bin")) == ["llama-server"]

    def test_set_id_bits_are_dropped(self, tmp_path: Path) -> None:
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w:gz") as tar:
            info = tarfile.TarInfo("llama-server")
            info.size, info.mode = 1, 0o4777
            tar.addfile(info, io.BytesIO(b"x"))
        dest = tmp_path / "out"
        dest.mkdir()

        unpack(write(tmp_path / "a.tar.gz", buf.getvalue()), dest)

        assert stat.S_IMODE((dest / "llama-server").stat().st_mode) == 0o755

    @pytest.mark.parametrize(
        ("files", "links"),
        [
            ({"../escaped": "x"}, {}),
            ({"/tmp/escaped-absolute": "x"}, {}),
            ({}, {"etc": "/etc"}),
            ({}, {"sub/up": "../.."}),
            # Each link resolves inside when made; together they reach out.
            ({}, {"x": "y/..", "y": "."}),
            # A link inside the tree, and a file written through a parent made to point out.
            ({"d/../../escaped": "x"}, {}),
            # A sibling whose name starts with the target's: a string-prefix check takes it for inside.
            ({"../out-evil/cron": "x"}, {}),
            ({}, {"lib": "../out-evil"}),
            ({"../out-evil": "x"}, {}),
        ],
    )
    def test_an_entry_or_link_leaving_the_directory_is_refused(
        self, tmp_path: Path, kit: Any, files: Any, links: Any
    ) -> None:
        dest = tmp_path / "a" / "out"
        dest.mkdir(parents=True)

        with pytest.raises(UnsafeArchiveError, match="outside"):
            unpack(write(tmp_path / "a.tar.gz", kit.tar_gz(files, links)), dest)

        assert not (tmp_path / "a" / "escaped").exists()
        assert not (tmp_path / "escaped").exists()
        assert not (tmp_path / "a" / "out-evil").exists()

    def test_a_file_cannot_be_written_through_a_link_to_outside(self, tmp_path: Path) -> None:
        """The classic: a symlink to a directory outside, then a file under the symlink's name."""
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w:gz") as tar:
            link = tarfile.TarInfo("lib")
            link.type, link.linkname = tarfile.SYMTYPE, "../victim"
            tar.addfile(link)
            body = tarfile.TarInfo("lib/owned")
            body.size = 1
            tar.addfile(body, io.BytesIO(b"x"))
        (tmp_path / "victim").mkdir()
        dest = tmp_path / "out"
        dest.mkdir()

        with pytest.raises(UnsafeArchiveError):
            unpack(write(tmp_path / "a.tar.gz", buf.getvalue()), dest)

        assert not (tmp_path / "victim" / "owned").exists()

    def test_links_each_inside_that_together_reach_a_sibling_named_like_the_directory_are_refused(
        self, tmp_path: Path, kit: Any
    ) -> None:
        """x -> y/../out-evil is inside while y is missing; once y -> . exists, x reaches ../out-evil.

        Checked as a string prefix, ".../out-evil" starts with ".../out": every test passed.
        """
        (tmp_path / "out-evil").mkdir()
        dest = tmp_path / "out"
        dest.mkdir()

        archive = write(tmp_path / "a.tar.gz", kit.tar_gz({}, {"x": "y/../out-evil", "y": "."}))
        with pytest.raises(UnsafeArchiveError, match=r"x links outside the archive \(to y/\.\./out-evil\)"):
            unpack(archive, dest)

    def test_no_file_is_written_through_a_link_to_a_sibling_named_like_the_directory(
        self, tmp_path: Path
    ) -> None:
        """Written before the whole tree is checked: a per-entry check as a string prefix let the file out."""
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w:gz") as tar:
            link = tarfile.TarInfo("lib")
            link.type, link.linkname = tarfile.SYMTYPE, "../out-evil"
            tar.addfile(link)
            body = tarfile.TarInfo("lib/cron")
            body.size = 1
            tar.addfile(body, io.BytesIO(b"x"))
        (tmp_path / "out-evil").mkdir()
        dest = tmp_path / "out"
        dest.mkdir()

        with pytest.raises(UnsafeArchiveError, match="outside"):
            unpack(write(tmp_path / "a.tar.gz", buf.getvalue()), dest)

        assert list((tmp_path / "out-evil").iterdir()) == []


class TestZip:
    def test_a_zip_is_unpacked_with_its_symlinks(self, tmp_path: Path, kit: Any) -> None:
        data = kit.zip_bytes(
            {"bin/llama-server": "#!/bin/sh\n", "bin/libllama.so.0": "x"},
            {"bin/libllama.so": "libllama.so.0"},
        )
        dest = tmp_path / "out"
        dest.mkdir()

        unpack(write(tmp_path / "a.zip", data), dest)

        assert os.access(dest / "bin" / "llama-server", os.X_OK)
        assert os.readlink(dest / "bin" / "libllama.so") == "libllama.so.0"

    @pytest.mark.parametrize(
        ("files", "links"),
        [
            ({"../escaped": "x"}, {}),
            ({}, {"bin/lib": "../../x"}),
            ({}, {"lib": "/usr/lib"}),
            # A sibling whose name starts with the target's: a string-prefix check takes it for inside.
            ({"../out-evil/cron": "x"}, {}),
            ({}, {"lib": "../out-evil"}),
        ],
    )
    def test_a_zip_leaving_its_directory_is_refused(
        self, tmp_path: Path, kit: Any, files: Any, links: Any
    ) -> None:
        dest = tmp_path / "out"
        dest.mkdir()

        with pytest.raises(UnsafeArchiveError):
            unpack(write(tmp_path / "a.zip", kit.zip_bytes(files, links)), dest)

        assert not (tmp_path / "escaped").exists()
        assert not (tmp_path / "out-evil").exists()


def test_a_file_that_is_not_an_archive_is_refused_as_such(tmp_path: Path) -> None:
    dest = tmp_path / "out"
    dest.mkdir()

    with pytest.raises(ArchiveFormatError, match="not a readable archive"):
        unpack(write(tmp_path / "a.tar.gz", b"<html>rate limited</html>"), dest)
    with pytest.raises(ArchiveFormatError, match=r"not a \.tar\.gz or \.zip"):
        unpack(write(tmp_path / "a.rar", b""), dest)
