"""A real vLLM (its CPU build), started by the supervisor as the agent starts it, serves through the gateway.

The session's vLLM is the agent's own install (tests/vllm_env.py: the
agent's installer, into ${LLMGW_BUILD_CACHE:-~/.cache/llmgw}/engines once,
3 to 9 minutes and 3.4 GB; later runs find it), and
scripts/make_tiny_hf_model.py writes the model. vLLM takes one to three
minutes to start on 2 cores (it compiles the model with torch the first
time), so these tests are slow, and they do not skip: a machine that cannot
install vLLM fails them saying why.
"""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import attrs
import pytest
import pytest_asyncio
from aiohttp.test_utils import TestClient, TestServer

from llmgw.agent.supervisor import Supervisor
from llmgw.capacity.estimate import estimate
from llmgw.capacity.shape import read_shape
from llmgw.catalog import Catalog
from llmgw.config import ModelConfig, ServerConfig
from llmgw.engines.base import LaunchSpec
from llmgw.engines.check import check_engine
from llmgw.engines.vllm import SERVER_MODULE, VllmEngine, failure_reason
from llmgw.gateway.admission import Admission
from llmgw.gateway.app import make_gateway_app
from llmgw.gateway.auth import KeyCache
from llmgw.gateway.quotas import Quotas
from llmgw.gateway.usage import UsageRecorder
from llmgw.proto.llmgw import v1 as pb
from llmgw.routes import EngineRoute
from llmgw.store import open_store
from llmgw.store.keys import create_key
from llmgw.store.usage import usage_by_day

from ..agent.reports import Reports
from ..vllm_env import INSTALL_WITHIN_S, VERSION
from ..waiting import eventually

ROOT = Path(__file__).resolve().parents[2]
SECRET = "replica-secret-for-the-test"
# Starting takes 1 to 3 minutes on 2 shared cores (100 to 200 s measured).
READY_WITHIN_S = 600.0

pytestmark = [
    pytest.mark.slow,
    # The install, when the cache is empty, then two starts of vLLM.
    pytest.mark.timeout(INSTALL_WITHIN_S + 1500),
    pytest.mark.asyncio(loop_scope="module"),
]


def _tiny_model(out: Path, *args: str) -> Path:
    subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "make_tiny_hf_model.py"), "--out", str(out), *args],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    return out


class WithWeights(VllmEngine):
    """The vLLM adapter, given a model directory as the weights cache would give it."""

    def __init__(self, weights: Path) -> None:
        self.weights = weights

    def command(self, spec: LaunchSpec) -> list[str]:
        return super().command(attrs.evolve(spec, model_path=str(self.weights)))


def _start(model: str) -> pb.StartShard:
    """A StartShard as the control plane sends it for a CPU replica: a profile with its KV cache size."""
    return pb.StartShard(
        shard_id="s1",
        model=model,
        engine="vllm",
        context_size=512,
        parallel=4,
        # 1 GiB of KV cache: vLLM's CPU default takes a share of the machine's memory.
        env={"VLLM_CPU_KVCACHE_SPACE": "1"},
        engine_secret=SECRET,
    )


async def _reached(reports: Reports, state: str) -> pb.ShardStatus:
    """The first status of state, waited for as long as vLLM may take to start."""

    def reported() -> pb.ShardStatus | None:
        return next((s for s in reports.statuses if s.state == state), None)

    def failed_instead() -> bool:
        return state != "failed" and reported() is None and any(s.state == "failed" for s in reports.statuses)

    await eventually(lambda: reported() is not None or failed_instead(), within_s=READY_WITHIN_S)
    if failed_instead():
        failed = next(s for s in reports.statuses if s.state == "failed")
        tail = "\n".join(failed.last_output[-40:])
        pytest.fail(f"vLLM failed before {state}: {failed.detail}\n{tail}")
    status = reported()
    assert status is not None
    return status


@attrs.frozen
class _Running:
    """vLLM serving the tiny model: its endpoint, the model directory, the supervisor keeping its output."""

    endpoint: str
    model: Path
    supervisor: Supervisor


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def running(vllm_python: Path, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[_Running]:
    """vLLM serving the tiny model as tiny-chat, started by a supervisor."""
    model = _tiny_model(tmp_path_factory.mktemp("model") / "tiny")
    reports = Reports()
    async with Supervisor(
        {"vllm": WithWeights(model)},
        reports,
        ready_timeout_s=READY_WITHIN_S,
        state_dir=tmp_path_factory.mktemp("agent"),
        binaries=lambda _: str(vllm_python),
    ) as supervisor:
        await supervisor.start(_start("tiny-chat"))
        ready = await _reached(reports, "ready")
        yield _Running(ready.endpoint, model, supervisor)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def engine(running: _Running) -> str:
    """The endpoint of the module's vLLM."""
    return running.endpoint


async def test_the_kv_cache_vllm_sizes_holds_as_many_bytes_a_token_as_the_estimate_says(
    running: _Running,
) -> None:
    """The cache space vLLM was given over the tokens it says that holds, against `model plan`'s rule."""
    output = "\n".join(running.supervisor.output("s1"))
    space = re.search(r"set \(([\d.]+)/[\d.]+\) GiB for KV cache", output)
    tokens = re.search(r"KV cache size: ([\d,]+) tokens", output)
    assert space and tokens, f"no KV cache lines in vLLM's output:\n{output[-3000:]}"
    measured = float(space[1]) * (1 << 30) / int(tokens[1].replace(",", ""))
    shape = await asyncio.to_thread(read_shape, running.model)
    estimated = estimate(shape, "vllm", context=512).kv_bytes_per_token
    assert abs(measured / estimated - 1) <= 0.10, (measured, estimated)


@attrs.define
class _OneEngine:
    """The inventory's routing, for one ready engine and its secret."""

    endpoint: str

    def ready_endpoints(self, model: str) -> list[str]:
        return [self.endpoint]

    def why_no_ready(self, model: str) -> str:
        return "none"

    def route(self, endpoint: str) -> EngineRoute:
        lost: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        return EngineRoute(node_id="n1", shard_id="s1", secret=SECRET, lost=lost, refused=lambda _: None)


async def _through_gateway(
    endpoint: str, tmp_path: Path, body: dict[str, Any]
) -> tuple[int, bytes, tuple[int, int]]:
    """POST body to the gateway in front of endpoint: its status, its bytes, and the tokens charged."""
    recorder = UsageRecorder()
    async with open_store(tmp_path / "llmgw.db") as store:
        plaintext, _ = await create_key(store, "k")
        keys = KeyCache()
        await keys.refresh(store)
        cfg = ServerConfig(models=[ModelConfig(name="tiny-chat")])
        catalog = Catalog(cfg)
        quotas = Quotas(recorder)
        await quotas.refresh(store)
        app = make_gateway_app(
            cfg, catalog, _OneEngine(endpoint), keys, Admission(cfg, catalog, quotas, recorder)
        )
        async with TestClient(TestServer(app, host="127.0.0.1", port=0)) as gateway:
            headers = {"Authorization": f"Bearer {plaintext}"}
            async with gateway.post("/v1/chat/completions", json=body, headers=headers) as resp:
                status, raw = resp.status, await resp.read()
        await recorder.flush(store)
        rows = await usage_by_day(store)
    charged = (rows[0].prompt_tokens, rows[0].completion_tokens) if rows else (0, 0)
    return status, raw, charged


CHAT = {
    "model": "tiny-chat",
    "messages": [{"role": "user", "content": "Hello"}],
    "max_tokens": 8,
    "temperature": 0,
}


async def test_a_chat_through_the_gateway_comes_back_with_the_engines_own_usage_and_is_charged_it(
    engine: str, tmp_path: Path
) -> None:
    status, raw, charged = await _through_gateway(engine, tmp_path, CHAT)
    assert status == 200, raw
    reply = json.loads(raw)
    assert reply["object"] == "chat.completion"
    assert reply["model"] == "tiny-chat"
    assert reply["choices"][0]["message"]["role"] == "assistant"
    usage = reply["usage"]
    assert usage["prompt_tokens"] > 0
    assert 1 <= usage["completion_tokens"] <= 8
    assert charged == (usage["prompt_tokens"], usage["completion_tokens"])


async def test_a_stream_through_the_gateway_ends_with_the_engines_usage_chunk(
    engine: str, tmp_path: Path
) -> None:
    body = {**CHAT, "stream": True, "stream_options": {"include_usage": True}}
    status, raw, charged = await _through_gateway(engine, tmp_path, body)
    assert status == 200, raw
    events = [line.removeprefix(b"data: ") for line in raw.splitlines() if line.startswith(b"data: ")]
    assert events[-1] == b"[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    usage = chunks[-1]["usage"]
    assert usage["prompt_tokens"] > 0
    assert 1 <= usage["completion_tokens"] <= 8
    assert any(c["choices"] and c["choices"][0]["delta"].get("content") for c in chunks[:-1])
    assert charged == (usage["prompt_tokens"], usage["completion_tokens"])


async def test_the_engine_refuses_callers_without_the_replicas_secret_and_leaves_health_and_metrics_open(
    engine: str,
) -> None:
    async with aiohttp.ClientSession() as session:
        async with session.get(engine + "/v1/models") as resp:
            assert resp.status == 401
        async with session.get(engine + "/v1/models", headers={"Authorization": f"Bearer {SECRET}"}) as resp:
            assert [m["id"] for m in (await resp.json())["data"]] == ["tiny-chat"]
        async with session.get(engine + "/metrics") as resp:
            assert resp.status == 200
            assert "vllm:num_requests_running" in await resp.text()


async def test_the_version_is_read_without_vllms_cli(vllm_python: Path) -> None:
    process = await asyncio.create_subprocess_exec(
        *VllmEngine().probe_command(str(vllm_python)),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL,
    )
    out, _ = await process.communicate()
    assert process.returncode == 0
    assert out.decode().strip().splitlines()[-1] == VERSION


# --- a model vLLM's CPU attention cannot run: healthy, then dead at the first request ----------


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def dead_at_first_request(
    vllm_python: Path, tmp_path_factory: pytest.TempPathFactory
) -> tuple[int, pb.ShardStatus]:
    """The status of the request that met a head size of 16, and the replica's failed status."""
    model = _tiny_model(tmp_path_factory.mktemp("model") / "head-dim-16", "--heads", "4", "--head-dim", "16")
    reports = Reports()
    async with Supervisor(
        {"vllm": WithWeights(model)},
        reports,
        ready_timeout_s=READY_WITHIN_S,
        state_dir=tmp_path_factory.mktemp("agent"),
        binaries=lambda _: str(vllm_python),
    ) as supervisor:
        await supervisor.start(_start("tiny-heads"))
        ready = await _reached(reports, "ready")
        body = {**CHAT, "model": "tiny-heads"}
        async with (
            aiohttp.ClientSession() as session,
            session.post(
                ready.endpoint + "/v1/chat/completions",
                json=body,
                headers={"Authorization": f"Bearer {SECRET}"},
            ) as resp,
        ):
            answered = resp.status
            await resp.read()
        loop = asyncio.get_running_loop()
        since = loop.time()
        failed = await _reached(reports, "failed")
        # How long after its 500 the agent reports the engine's exit, with its cause: what the
        # gateway waits for (CAUSE_WAIT_S) to name the cause in that first request's error.
        print(f"\nvLLM's failed status came {loop.time() - since:.1f} s after its 500")
    return answered, failed


async def test_a_head_size_the_cpu_cannot_run_kills_the_engine_and_its_output_names_why(
    dead_at_first_request: tuple[int, pb.ShardStatus],
) -> None:
    answered, failed = dead_at_first_request
    assert answered == 500
    assert failed.detail.startswith("vllm exited with code "), failed.detail
    assert "after serving" in failed.detail, failed.detail
    said = failure_reason(failed.last_output)
    # isa= is the CPU's instruction set, which differs between machines.
    assert said is not None and said.startswith("Unsupported CPU attention configuration: head_dim=16 "), said


async def test_a_head_size_the_cpu_cannot_run_is_the_replicas_failure_reason_in_words(
    dead_at_first_request: tuple[int, pb.ShardStatus],
) -> None:
    _, failed = dead_at_first_request
    assert "Unsupported CPU attention configuration: head_dim=16" in failed.detail, failed.detail


async def test_engine_check_reads_the_flags_of_the_server_module_through_the_interpreter(
    vllm_python: Path,
) -> None:
    checked = await check_engine("vllm", VllmEngine(), str(vllm_python), timeout_s=300)
    assert checked.missing == (), checked
    assert checked.help_command.endswith(f"-m {SERVER_MODULE} --help=all"), checked.help_command
    assert checked.version == VERSION
