#!/usr/bin/env python3
"""Write the lock of an engine installed with pip, from an environment seen to work.

    scripts/lock-engine.py --engine vllm --version 0.32.0 --variant cpu \
        --env /path/to/working-venv --exclude torchvision,torchaudio,torchcodec

The environment's packages (`pip freeze --all`, less --exclude) are resolved
again with `pip install --dry-run --no-deps --report`, which names the very
wheel pip would fetch for each and its sha256 without installing anything
(the wheels pass through pip's cache, nothing else is written). The lock goes
to src/llmgw/engines/locks/ENGINE-VERSION-VARIANT.txt, with a header giving
the environment's Python, machine and size. --report reuses a report written
before, to skip the resolution.

Run it with the same pip configuration as the nodes will have: the index that
serves a wheel decides its hash only when two indexes serve different files.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

LOCKS = Path(__file__).resolve().parent.parent / "src" / "llmgw" / "engines" / "locks"
_MACHINES = {"x86_64": "amd64", "aarch64": "arm64"}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--engine", required=True)
    ap.add_argument("--version", required=True)
    ap.add_argument("--variant", required=True)
    ap.add_argument("--env", required=True, type=Path, help="a virtual environment where the engine works")
    ap.add_argument("--exclude", default="", help="packages to leave out, comma-separated")
    ap.add_argument("--report", type=Path, help="a pip --report of the environment's pins, written before")
    ap.add_argument("--out", type=Path)
    ap.add_argument(
        "--tried",
        default="",
        help="what was seen to work in the environment, when it is less than serving "
        "(a CUDA build on a machine without a GPU: 'installed; import vllm, torch, transformers')",
    )
    args = ap.parse_args()
    python = args.env / "bin" / "python"
    leave_out = {_norm(n) for n in args.exclude.split(",") if n.strip()}
    report = args.report or _resolve(python, leave_out)
    installs = json.loads(report.read_text())["install"]
    lines = []
    for item in sorted(installs, key=lambda i: _norm(i["metadata"]["name"])):
        name, version = item["metadata"]["name"], item["metadata"]["version"]
        if _norm(name) in leave_out:
            continue
        digest = item["download_info"].get("archive_info", {}).get("hashes", {}).get("sha256")
        if not digest:
            print(f"{name} {version}: pip gave no sha256 for {item['download_info']['url']}", file=sys.stderr)
            return 1
        lines.append(f"{name}=={version} \\\n    --hash=sha256:{digest}\n")
    pyver = _run([str(python), "-c", "import sys; print('%d.%d' % sys.version_info[:2])"]).strip()
    size_mb = int(_run(["du", "-sm", str(args.env)]).split()[0])
    out = args.out or LOCKS / f"{args.engine}-{args.version}-{args.variant}.txt"
    header = [
        f"# {args.engine} {args.version} ({args.variant}): every package of its environment, pinned by hash.",
        "# Written by scripts/lock-engine.py from an environment seen to work; do not edit by hand.",
        *([f"# Tried: {args.tried}."] if args.tried else []),
        f"# Left out: {', '.join(sorted(leave_out))}." if leave_out else "# Nothing left out.",
        f"# python: {pyver}",
        f"# machine: {_MACHINES.get(platform.machine(), platform.machine())}",
        # A tenth more than the environment took here: bytecode and pip's own scratch space.
        f"# needs-mb: {size_mb + size_mb // 10}",
    ]
    out.write_text("\n".join(header) + "\n" + "".join(lines), encoding="utf-8")
    print(f"wrote {out} ({len(lines)} packages)")
    return 0


def _resolve(python: Path, leave_out: set[str]) -> Path:
    frozen = _run([str(python), "-m", "pip", "freeze", "--all", "--exclude", "pip"])
    pins = [ln for ln in frozen.splitlines() if "==" in ln and _norm(ln.split("==")[0]) not in leave_out]
    work = Path(tempfile.mkdtemp(prefix="lock-engine-"))
    (work / "pins.txt").write_text("\n".join(pins) + "\n")
    report = work / "report.json"
    subprocess.run(
        [str(python), "-m", "pip", "install", "--dry-run", "--ignore-installed", "--no-deps",
         "--only-binary", ":all:", "--report", str(report), "-r", str(work / "pins.txt")],
        check=True,
        env={**os.environ, "PIP_NO_INPUT": "1"},
    )  # fmt: skip
    return report


def _run(argv: list[str]) -> str:
    return subprocess.run(argv, check=True, capture_output=True, text=True).stdout


def _norm(name: str) -> str:
    return name.strip().lower().replace("_", "-").replace(".", "-")


if __name__ == "__main__":
    raise SystemExit(main())
