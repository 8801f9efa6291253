"""The estimate held to a real llama-server's own account of its buffers, on the tiny GGUF."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from llmgw.capacity.estimate import MIB, estimate
from llmgw.capacity.shape import read_shape
from tests import needs
from tests.waiting import eventually_async

ROOT = Path(__file__).resolve().parents[2]
BUILD = needs.LLAMA_BUILD

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("llama_server")]

# "llama_kv_cache: size =    2.00 MiB (  2048 cells, ...": the cache llama.cpp allocated, keys and values.
_KV = re.compile(r"llama_kv_cache: size =\s+([\d.]+) MiB")
_MODEL = re.compile(r"model buffer size =\s+([\d.]+) MiB")


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny GGUF the llama-server tests run, written once for the module."""
    model = tmp_path_factory.mktemp("model") / "tiny.gguf"
    vocab = BUILD / "ggml-vocab-llama-spm.gguf"
    script = ROOT / "scripts" / "make_tiny_gguf.py"
    subprocess.run(
        [sys.executable, str(script), "--vocab", str(vocab), "--out", str(model)],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    return model


async def _says(log: Path, words: str) -> bool:
    return words in await asyncio.to_thread(log.read_text, errors="replace")


async def _logged_sizes(model: Path, log: Path, context: int, parallel: int) -> tuple[float, float]:
    """llama-server's logged KV cache and model buffer, in MiB, once it has loaded model."""
    command = [str(BUILD / "bin" / "llama-server"), "-m", str(model), "--host", "127.0.0.1", "--port", "0"]
    command += ["-c", str(context * parallel), "-np", str(parallel), "--threads", "1", "-lv", "4"]
    out = await asyncio.to_thread(log.open, "wb")
    with out:
        process = await asyncio.create_subprocess_exec(
            *command, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True
        )
    try:
        await eventually_async(lambda: _says(log, "listening on"), within_s=60)
    finally:
        os.killpg(process.pid, signal.SIGKILL)
        await process.wait()
    text = await asyncio.to_thread(log.read_text, errors="replace")
    kv, weights = _KV.search(text), _MODEL.search(text)
    assert kv and weights, text[-2000:]
    return float(kv.group(1)), float(weights.group(1))


# 8192 × 1 is past the model's trained 2048: llama-server allocates all of it all the same.
@pytest.mark.parametrize(("context", "parallel"), [(1024, 1), (2048, 2), (8192, 1)])
async def test_the_kv_estimate_is_within_ten_percent_of_what_llama_server_allocates(
    tiny_model: Path, tmp_path: Path, context: int, parallel: int
):
    log = tmp_path / "llama-server.log"
    real_kv, real_weights = await _logged_sizes(tiny_model, log, context, parallel)
    shape = await asyncio.to_thread(read_shape, tiny_model)
    e = estimate(shape, "llamacpp", context=context, parallel=parallel)
    assert e.kv_bytes / MIB == pytest.approx(real_kv, rel=0.10)
    # The model buffer is the tensors plus alignment: the same bytes, give or take a few kilobytes.
    assert e.weights_bytes / MIB == pytest.approx(real_weights, rel=0.10)
