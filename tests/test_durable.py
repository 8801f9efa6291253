"""Files replaced whole and on disk: the new bytes synced before the rename, the directory after it."""

from __future__ import annotations

import ast
import os
import stat
from collections.abc import Callable
from pathlib import Path

import attrs
import pytest

import llmgw
from llmgw import durable
from llmgw.agent import state, trial
from llmgw.agent.upgrade import _commit
from llmgw.config.editing import replace_text

SRC = Path(llmgw.__file__).parent


@attrs.frozen
class Synced:
    """One fsync: of a directory or not, the inode synced, and what each name of the watched directory
    was then (name -> inode)."""

    is_dir: bool
    inode: int
    names: dict[str, int]


@pytest.fixture
def syncs(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Callable[[Path], list[Synced]]:
    """Every fsync made while the test runs, with each directory under tmp_path as it stood then; the
    function returned gives them as one directory (given later) saw them."""
    seen: list[tuple[bool, int, dict[str, dict[str, int]]]] = []
    real_fsync = os.fsync

    def recording_fsync(fd: int) -> None:
        status = os.fstat(fd)
        listings = {
            root: {name: os.lstat(os.path.join(root, name)).st_ino for name in dirs + files}
            for root, dirs, files in os.walk(tmp_path)
        }
        seen.append((stat.S_ISDIR(status.st_mode), status.st_ino, listings))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", recording_fsync)

    def made_in(directory: Path) -> list[Synced]:
        return [Synced(is_dir, ino, listings.get(str(directory), {})) for is_dir, ino, listings in seen]

    return made_in


def _assert_durable(path: Path, synced: list[Synced]) -> None:
    """What is now at path was synced before it had the name, and its directory once it had it."""
    inode, folder = path.lstat().st_ino, path.parent.stat().st_ino
    file_synced = [i for i, s in enumerate(synced) if s.inode == inode]
    named = [
        i for i, s in enumerate(synced) if s.is_dir and s.inode == folder and s.names.get(path.name) == inode
    ]
    assert file_synced, f"{path}'s bytes were never synced"
    assert synced[file_synced[0]].names.get(path.name) != inode, f"{path} was synced only after its rename"
    assert named and file_synced[0] < named[0], (
        f"{path.parent} was not synced once it held the new {path.name}"
    )


class TestWriteAtomically:
    def test_the_bytes_are_synced_before_the_rename_and_the_directory_after(
        self, tmp_path: Path, syncs: Callable[[Path], list[Synced]]
    ) -> None:
        path = tmp_path / "state.json"
        path.write_text("old")
        durable.write_atomically(path, "new", 0o600)
        assert path.read_text() == "new"
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        assert os.listdir(tmp_path) == ["state.json"]
        _assert_durable(path, syncs(tmp_path))

    def test_a_secret_is_never_readable_by_others_even_under_a_loose_umask(self, tmp_path: Path) -> None:
        old = os.umask(0)
        try:
            durable.write_atomically(tmp_path / "key", b"secret", 0o600)
        finally:
            os.umask(old)
        assert stat.S_IMODE((tmp_path / "key").stat().st_mode) == 0o600

    def test_a_failure_leaves_the_old_file_and_no_stray_copy(self, tmp_path: Path) -> None:
        path = tmp_path / "server.yaml"
        path.write_text("old")

        def refuse(_: Path) -> None:
            raise PermissionError("no")

        with pytest.raises(PermissionError):
            durable.write_atomically(path, "new", prepare=refuse)
        assert path.read_text() == "old" and os.listdir(tmp_path) == ["server.yaml"]


class TestMoveIntoPlace:
    def test_a_file_is_synced_before_it_takes_the_name(
        self, tmp_path: Path, syncs: Callable[[Path], list[Synced]]
    ) -> None:
        (tmp_path / "weights.part").write_bytes(b"w" * 1000)
        durable.move_into_place(tmp_path / "weights.part", tmp_path / "weights")
        _assert_durable(tmp_path / "weights", syncs(tmp_path))

    def test_a_directory_is_synced_file_by_file_before_it_takes_the_name(
        self, tmp_path: Path, syncs: Callable[[Path], list[Synced]]
    ) -> None:
        build = tmp_path / "b.partial"
        (build / "bin").mkdir(parents=True)
        (build / "bin" / "llama-server").write_bytes(b"\x7fELF")
        durable.move_into_place(build, tmp_path / "b")
        inner = (tmp_path / "b" / "bin" / "llama-server").stat().st_ino
        synced = syncs(tmp_path)
        assert any(not s.is_dir and s.inode == inner and "b" not in s.names for s in synced)
        assert all(s.inode != inner for s in synced if "b" in s.names)
        _assert_durable(tmp_path / "b", synced)

    def test_a_symlink_takes_the_name_and_its_directory_is_synced(
        self, tmp_path: Path, syncs: Callable[[Path], list[Synced]]
    ) -> None:
        (tmp_path / "current.part").symlink_to("0.12.0")
        durable.move_into_place(tmp_path / "current.part", tmp_path / "current")
        assert os.readlink(tmp_path / "current") == "0.12.0"
        folder = tmp_path.stat().st_ino
        assert any(s.is_dir and s.inode == folder and "current" in s.names for s in syncs(tmp_path))


class TestCallers:
    """The files whose loss does most harm, each through the helper."""

    def test_the_agents_state_file_with_the_engines_secrets(
        self, tmp_path: Path, syncs: Callable[[Path], list[Synced]]
    ) -> None:
        state.write_state(tmp_path, [])
        _assert_durable(tmp_path / state.STATE_FILE, syncs(tmp_path))

    def test_the_upgrade_marker_and_the_current_link(
        self, tmp_path: Path, syncs: Callable[[Path], list[Synced]]
    ) -> None:
        marker = trial.Marker(to="0.12.0", from_version="0.11.0", state=trial.TRIAL)
        _commit(tmp_path, marker)
        _assert_durable(tmp_path / trial.MARKER, syncs(tmp_path))
        versions = tmp_path / "versions"
        folder = versions.stat().st_ino
        assert any(s.is_dir and s.inode == folder and "current" in s.names for s in syncs(versions))

    def test_a_config_edit(self, tmp_path: Path, syncs: Callable[[Path], list[Synced]]) -> None:
        path = tmp_path / "server.yaml"
        path.write_text("listen: 127.0.0.1:8080\n")
        path.chmod(0o640)
        replace_text(path, "listen: 127.0.0.1:9090\n")
        assert stat.S_IMODE(path.stat().st_mode) == 0o640
        _assert_durable(path, syncs(tmp_path))


def _undurable_replaces(tree: ast.AST) -> list[int]:
    """Lines that rename or replace a file other than through llmgw.durable.

    os.replace and os.rename, called or handed to a thread; Path.rename and Path.replace, called with
    their one argument (str.replace takes two, datetime.replace keywords, scopes.rename three) or
    handed to a thread.
    """
    lines = set()
    called = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            called.add(id(node.func))
            # A method of llmgw's own (KeyCache.replace) is called on self.
            on_self = isinstance(node.func.value, ast.Name) and node.func.value.id == "self"
            one_argument = len(node.args) == 1 and not node.keywords
            if node.func.attr in ("replace", "rename") and one_argument and not on_self:
                lines.add(node.lineno)
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute) or node.attr not in ("replace", "rename"):
            continue
        if (isinstance(node.value, ast.Name) and node.value.id == "os") or (
            node.attr == "rename" and id(node) not in called
        ):
            lines.add(node.lineno)
    return sorted(lines)


def test_every_file_replaced_in_src_goes_through_the_durable_helper() -> None:
    """A bare os.replace leaves an empty file after a power loss: the next one added is caught here."""
    found = []
    for path in sorted(SRC.rglob("*.py")):
        if path == SRC / "durable.py" or "proto" in path.relative_to(SRC).parts:
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        found += [f"{path.relative_to(SRC)}:{line}" for line in _undurable_replaces(tree)]
    assert not found, "replaced without syncing (use llmgw.durable):\n" + "\n".join(found)


def test_the_scan_sees_each_way_of_replacing_a_file() -> None:
    """Guards the scan above against passing because it matches nothing."""
    source = (
        "os.replace(a, b)\n"
        "asyncio.to_thread(os.rename, a, b)\n"
        "part.rename(target)\n"
        "link.replace(current)\n"
        "text.replace('a', 'b')\n"
        "now.replace(microsecond=0)\n"
        "scopes.rename(store, scope, name)\n"
    )
    assert _undurable_replaces(ast.parse(source)) == [1, 2, 3, 4]
