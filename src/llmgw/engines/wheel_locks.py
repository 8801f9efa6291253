"""The locks llmgw ships for the engines it installs with pip: one file per engine, version and variant.

A lock (`locks/vllm-0.32.0-cpu.txt`) names every package of the engine's
environment at one version with the sha256 of each wheel, in the format of
pip's `--require-hashes`, so what a node installs is exactly what was tried
here, whatever the index serves on the day. scripts/lock-engine.py writes
them from an environment that was seen to work. Its header says what pip
cannot: which Python the wheels are for, which machine, and how much disk
the environment takes.
"""

from __future__ import annotations

import re
from pathlib import Path

import attrs

LOCKS_DIR = Path(__file__).parent / "locks"

# Listed once, when llmgw is imported: the files are part of the package and do not change under it.
_LOCKS = frozenset(p.name for p in LOCKS_DIR.glob("*.txt"))

_HEADER = re.compile(r"#\s*(python|machine|needs-mb):\s*(.+?)\s*$")


@attrs.frozen
class LockHeader:
    """What a lock says of the environment besides its packages."""

    # "3.11": the Pythons whose wheels the lock holds.
    pythons: tuple[str, ...]
    # "amd64", in Debian's spelling like Host.arch.
    machine: str
    # Disk the installed environment takes, in MB.
    needs_mb: int


def find_lock(engine: str, version: str, variant: str) -> Path | None:
    """The lock of engine at version for variant, or None when llmgw ships none."""
    name = f"{engine}-{version}-{variant}.txt"
    return LOCKS_DIR / name if name in _LOCKS else None


def locked_versions(engine: str, variant: str) -> list[str]:
    """The versions of engine llmgw ships a lock of for variant, oldest name first."""
    tail = f"-{variant}.txt"
    head = f"{engine}-"
    return sorted(n[len(head) : -len(tail)] for n in _LOCKS if n.startswith(head) and n.endswith(tail))


def read_header(lock: Path) -> LockHeader:
    """The header of a lock file. Blocking: call it in a thread."""
    found: dict[str, str] = {}
    with lock.open(encoding="utf-8") as f:
        for line in f:
            if not line.startswith("#"):
                break
            m = _HEADER.match(line)
            if m:
                found[m.group(1)] = m.group(2)
    pythons = tuple(v.strip() for v in found.get("python", "").split(",") if v.strip())
    needs = found.get("needs-mb", "0")
    return LockHeader(
        pythons=pythons, machine=found.get("machine", ""), needs_mb=int(needs) if needs.isdigit() else 0
    )
