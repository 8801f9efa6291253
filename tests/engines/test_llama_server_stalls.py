"""A real llama-server behind the gateway: SIGSTOPped before its first byte or mid-stream, left mid-stream.

Each test starts a llama-server of its own (a stopped process would break
the module-wide one of test_llama_server.py) and a gateway with admission in
front of it, with small `timeouts`. Needs the build of
scripts/build-llama-server.sh in its cache, as test_llama_server.py does.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import attrs
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from llmgw.bodies import SERVER_OPTIONS
from llmgw.catalog import Catalog
from llmgw.config import ModelConfig, ServerConfig, TimeoutsConfig
from llmgw.control.inventory import Inventory
from llmgw.engines.base import LaunchSpec
from llmgw.engines.llamacpp import LlamaCppEngine
from llmgw.gateway.admission import Admission
from llmgw.gateway.app import ROUTER_KEY, make_gateway_app
from llmgw.gateway.auth import KeyCache
from llmgw.gateway.prompts import prompt_bound
from llmgw.gateway.quotas import Quotas
from llmgw.gateway.usage import UsageRecorder
from llmgw.proto.llmgw import v1 as pb
from llmgw.routes import EngineRoute
from llmgw.store import Store, open_store
from llmgw.store.keys import create_key
from llmgw.store.usage import usage_by_day
from tests import needs
from tests.waiting import eventually, eventually_async

ROOT = Path(__file__).resolve().parents[2]
BUILD = needs.LLAMA_BUILD
MODEL = "tiny-chat"
CHAT = "/v1/chat/completions"
# Small, so a stopped engine is found out quickly; not so small that a busy test machine trips them.
TIMEOUTS = TimeoutsConfig(connect_s=2, first_byte_s=2, idle_s=2, total_s=300)
# The context, in one slot: a generation that ignores EOS runs to its end unless it is cancelled.
# Long, so that it cannot end while the cancel is on its way: the tiny model decodes 1,300 tokens a
# second here, and its 2,048 once ran to their end on a loaded CI machine before the gateway and
# llama-server saw the client gone. llama-server gives a slot no more than the context the model
# was trained on, so the model is written with this one.
CONTEXT = 32768
# A generation that runs until the context is full, unless someone stops it.
LONG = {
    "model": MODEL,
    "messages": [{"role": "user", "content": "Hello"}],
    "max_tokens": CONTEXT,
    "ignore_eos": True,
    "temperature": 0,
    "stream": True,
}

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("llama_server")]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny random-weight llama model, written once for the module."""
    model = tmp_path_factory.mktemp("model") / "tiny.gguf"
    subprocess.run(
        [
            sys.executable,
            str(ROOT / "scripts" / "make_tiny_gguf.py"),
            "--vocab",
            str(BUILD / "ggml-vocab-llama-spm.gguf"),
            "--out",
            str(model),
            "--context",
            str(CONTEXT),
        ],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    return model


@attrs.define
class Engine:
    process: asyncio.subprocess.Process
    url: str

    def stop(self) -> None:
        os.kill(self.process.pid, signal.SIGSTOP)


# One server per test: a test stops it, and the next must not inherit a stopped engine.
@pytest.fixture
async def engine(tiny_model: Path, tmp_path: Path) -> AsyncIterator[Engine]:
    """llama-server serving the tiny model as tiny-chat, with one slot, started as the adapter starts it."""
    adapter = LlamaCppEngine()
    spec = LaunchSpec(
        model=MODEL,
        port=_free_port(),
        model_path=str(tiny_model),
        context_size=CONTEXT,
        parallel=1,
        binary=str(BUILD / "bin" / "llama-server"),
        # One thread: the other core stays free for the gateway, which must see the client leave.
        args=("--threads", "1"),
    )
    log = tmp_path / "llama-server.log"
    with log.open("wb") as out:
        process = await asyncio.create_subprocess_exec(
            *adapter.command(spec),
            env={**os.environ, **adapter.environment(spec)},
            stdin=asyncio.subprocess.DEVNULL,
            stdout=out,
            stderr=asyncio.subprocess.STDOUT,
            start_new_session=True,
        )
    url = f"http://{spec.host}:{spec.port}"
    try:
        await _wait_healthy(url + adapter.health_path, process, log)
        yield Engine(process, url)
    finally:
        if process.returncode is None:
            # A stopped process takes no SIGTERM until it runs again.
            os.killpg(process.pid, signal.SIGCONT)
            os.killpg(process.pid, signal.SIGTERM)
            try:
                await asyncio.wait_for(process.wait(), 10)
            except TimeoutError:
                os.killpg(process.pid, signal.SIGKILL)
                await process.wait()


async def _wait_healthy(url: str, process: asyncio.subprocess.Process, log: Path) -> None:
    async def healthy() -> bool:
        if process.returncode is not None:
            tail = await asyncio.to_thread(lambda: log.read_text(errors="replace")[-3000:])
            pytest.fail(f"llama-server exited with {process.returncode}:\n{tail}")
        try:
            async with _fresh_connections() as session, session.get(url) as resp:
                return resp.status == 200
        except aiohttp.ClientConnectionError:
            return False

    await eventually_async(healthy, within_s=60)


def _fresh_connections() -> aiohttp.ClientSession:
    # llama-server may close a connection after a stream; a pooled one would then fail the next call.
    return aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True))


async def _metrics(engine: Engine) -> dict[str, float]:
    """llama-server's /metrics (the adapter passes --metrics), by series name."""
    async with _fresh_connections() as session, session.get(engine.url + "/metrics") as resp:
        text = await resp.text()
    return {
        name: float(value)
        for name, value in (line.split() for line in text.splitlines() if line and not line.startswith("#"))
    }


async def _slots_processing(engine: Engine) -> int:
    async with _fresh_connections() as session, session.get(engine.url + "/slots") as resp:
        return sum(1 for slot in await resp.json() if slot["is_processing"])


@attrs.define
class _OneReplica:
    """The routing table: one replica on node0, which leaves it when the gateway refuses it."""

    url: str
    refused: list[str] = attrs.field(factory=list)
    _route: EngineRoute | None = None

    def ready_endpoints(self, model: str) -> list[str]:
        return [] if self.refused else [self.url]

    def why_no_ready(self, model: str) -> str:
        return f"{model} has no ready replica"

    def route(self, endpoint: str) -> EngineRoute:
        if self._route is None:
            lost = asyncio.get_running_loop().create_future()
            self._route = EngineRoute("node0", "replica0", "", lost, self.refused.append)
        return self._route


@attrs.define
class Gateway:
    client: TestClient[web.Request, web.Application]
    replicas: _OneReplica
    recorder: UsageRecorder
    store: Store
    key: str

    async def post(self, body: dict[str, Any]) -> aiohttp.ClientResponse:
        return await self.client.post(CHAT, json=body, headers={"Authorization": f"Bearer {self.key}"})

    async def usage(self) -> tuple[int, int, int]:
        """(requests, prompt tokens, completion tokens) recorded."""
        await eventually(self.recorder.pending)
        await self.recorder.flush(self.store)
        rows = await usage_by_day(self.store)
        return (
            sum(r.requests for r in rows),
            sum(r.prompt_tokens for r in rows),
            sum(r.completion_tokens for r in rows),
        )


class _AsServed(TestServer):
    """The gateway's app run as roles/server.py runs it.

    TestServer cancels a handler whose client leaves; the gateway's runner does not (aiohttp's
    default), so there the proxy finds the client gone when its next write fails. That is the path a
    client leaving a real gateway takes, and the one these tests must hold.
    """

    async def _make_runner(self, **kwargs: Any) -> web.BaseRunner:
        return web.AppRunner(self.app, **{**kwargs, **SERVER_OPTIONS, "handler_cancellation": False})


@pytest.fixture
async def gateway(engine: Engine, tmp_path: Path) -> AsyncIterator[Gateway]:
    """A gateway with admission whose model has small timeouts, in front of the engine."""
    async with open_store(tmp_path / "llmgw.db") as store:
        cfg = ServerConfig(models=[ModelConfig(name=MODEL, timeouts=TIMEOUTS, max_tokens=CONTEXT)])
        catalog = Catalog(cfg)
        keys, recorder = KeyCache(), UsageRecorder()
        quotas = Quotas(recorder)
        replicas = _OneReplica(engine.url)
        app = make_gateway_app(cfg, catalog, replicas, keys, Admission(cfg, catalog, quotas, recorder))
        plaintext, _ = await create_key(store, "k")
        await keys.refresh(store)
        await quotas.refresh(store)
        async with TestClient(_AsServed(app, host="127.0.0.1", port=0)) as client:
            yield Gateway(client, replicas, recorder, store, plaintext)


def _reserved_prompt(body: dict[str, Any]) -> int:
    # What admission reserves for the prompt: the bound of the text that reaches the model.
    return prompt_bound(body)


def _events(body: bytes) -> list[dict[str, Any]]:
    return [json.loads(line[6:]) for line in body.split(b"\n\n") if line.startswith(b"data: {")]


async def _read_cut(resp: aiohttp.ClientResponse) -> bytes:
    """What a client reading a stream the gateway cut has: every byte before the cut."""
    got = b""
    try:
        async for chunk in resp.content.iter_any():
            got += chunk
    except aiohttp.ClientPayloadError:
        return got
    raise AssertionError("the stream ended as if it were whole")


async def test_a_client_that_leaves_mid_stream_stops_llama_server_generating_and_pays_for_what_it_was_sent(
    engine: Engine, gateway: Gateway
) -> None:
    resp = await gateway.post(LONG)
    assert resp.status == 200
    read = b""
    while read.count(b"\n\n") < 10:
        read += await resp.content.readany()
    assert (await _metrics(engine))["llamacpp:requests_processing"] == 1
    resp.close()

    async def idle() -> bool:
        return (await _metrics(engine))["llamacpp:requests_processing"] == 0

    # Long enough for the whole generation on a slow machine: what shows the cancel is how much was decoded.
    await eventually_async(idle, within_s=300)
    assert await _slots_processing(engine) == 0
    # Run to its end, the generation would have decoded about a token per place left in the context.
    decoded = (await _metrics(engine))["llamacpp:n_decode_total"]
    assert decoded < CONTEXT / 2, f"llama-server decoded {decoded:g} times: it generated on, unread"
    # llama-server reports usage only in its last chunk, which never came: the client is charged a
    # token for each event the gateway passed on (gateway/admission.py, _used), at least the ten it
    # read and at most what llama-server decoded; not the reservation of the whole context.
    requests, prompt, completion = await gateway.usage()
    assert (requests, prompt) == (1, _reserved_prompt(LONG))
    assert 10 <= completion <= decoded + 1, (completion, decoded)


async def test_a_stopped_llama_server_is_a_504_naming_the_model_and_first_byte_s(
    engine: Engine, gateway: Gateway
) -> None:
    engine.stop()
    resp = await gateway.post({**LONG, "stream": False, "max_tokens": 8})
    assert resp.status == 504
    assert resp.content_type == "application/json"
    error = (await resp.json())["error"]
    assert error["message"] == f"{MODEL} on node0 sent nothing for 2 s (timeouts.first_byte_s)"
    assert (error["type"], error["code"]) == ("server_error", "engine_timeout")
    # Its port still takes connections; only the gateway's wait tells, and the replica leaves routing.
    assert gateway.replicas.refused == [error["message"]]
    assert await gateway.usage() == (1, 0, 0)


async def test_a_llama_server_stopped_mid_stream_ends_it_with_an_error_event_naming_idle_s(
    engine: Engine, gateway: Gateway
) -> None:
    resp = await gateway.post(LONG)
    assert resp.status == 200
    first = await resp.content.readuntil(b"\n\n")
    engine.stop()
    events = _events(first + await _read_cut(resp))
    assert events[-1]["error"]["message"] == f"{MODEL} on node0 sent nothing more for 2 s (timeouts.idle_s)"
    assert all("error" not in event for event in events[:-1])
    # No usage came: the prompt reserved, and a completion token for each event the client had.
    assert await gateway.usage() == (1, _reserved_prompt(LONG), len(events) - 1)


# Long, so that only the stall's report can end a request in these tests, never a timeout.
PATIENT = TimeoutsConfig(connect_s=2, first_byte_s=120, idle_s=120, total_s=300)
STALL = "llamacpp on n1 stopped answering /health 3 s ago (3 probes in a row; the last: no answer within 1 s)"


@attrs.define
class Fleet:
    """A gateway routing by the control plane's inventory, where llama-server is replica s1 on n1."""

    gateway: Gateway
    inventory: Inventory
    endpoint: str

    def report_stalled(self) -> None:
        """What n1's agent reports once its probes find the engine stopped, before it kills it."""
        status = pb.ShardStatus(
            shard_id="s1",
            model=MODEL,
            engine="llamacpp",
            state="stalled",
            endpoint=self.endpoint,
            detail=STALL,
        )
        self.inventory.shard_status("n1", status)


@pytest.fixture
async def fleet(engine: Engine, tmp_path: Path) -> AsyncIterator[Fleet]:
    async with open_store(tmp_path / "llmgw.db") as store:
        cfg = ServerConfig(models=[ModelConfig(name=MODEL, timeouts=PATIENT, max_tokens=CONTEXT)])
        catalog = Catalog(cfg)
        keys, recorder = KeyCache(), UsageRecorder()
        quotas = Quotas(recorder)
        inventory = Inventory(grace_s=15)
        ready = pb.ShardStatus(
            shard_id="s1", model=MODEL, engine="llamacpp", state="ready", endpoint=engine.url
        )
        inventory.attach(pb.Register(node_id="n1", running=[ready]))
        app = make_gateway_app(cfg, catalog, inventory, keys, Admission(cfg, catalog, quotas, recorder))
        plaintext, _ = await create_key(store, "k")
        await keys.refresh(store)
        await quotas.refresh(store)
        async with TestClient(_AsServed(app, host="127.0.0.1", port=0)) as client:
            gateway = Gateway(client, _OneReplica(engine.url), recorder, store, plaintext)
            yield Fleet(gateway, inventory, engine.url)


async def test_a_stream_on_a_llama_server_reported_stalled_ends_at_once_naming_it_and_charging_what_was_sent(
    engine: Engine, fleet: Fleet
) -> None:
    resp = await fleet.gateway.post(LONG)
    assert resp.status == 200
    read = b""
    while read.count(b"\n\n") < 10:
        read += await resp.content.readany()
    engine.stop()
    fleet.report_stalled()
    events = _events(read + await _read_cut(resp))
    delivered = len(events) - 1
    assert all("error" not in event for event in events[:-1])
    error = events[-1]["error"]
    # Not "sent nothing more for 120 s (timeouts.idle_s)" two minutes on, nor a failed connection at the kill.
    assert error["message"] == (
        f"{MODEL} on n1 was abandoned mid-reply: its node reported it stalled: {STALL}; "
        f"{delivered} tokens had been delivered"
    )
    assert await fleet.gateway.usage() == (1, _reserved_prompt(LONG), delivered)


async def test_a_request_held_by_a_llama_server_reported_stalled_is_a_502_naming_the_stall(
    engine: Engine, fleet: Fleet
) -> None:
    engine.stop()
    body = {**LONG, "stream": False, "max_tokens": 8}
    request = asyncio.create_task(fleet.gateway.post(body))
    router = fleet.gateway.client.app[ROUTER_KEY]
    # Sent, and held: the stopped engine's kernel took the connection and the request.
    await eventually(lambda: router.in_flight.get(engine.url) == 1)
    fleet.report_stalled()
    resp = await request
    assert resp.status == 502
    error = (await resp.json())["error"]
    host = engine.url.removeprefix("http://")
    assert error["message"] == (
        f"the engine for {MODEL} at {host} on node n1 was abandoned mid-request: its node reported it "
        f"stalled: {STALL}"
    )
    assert error["code"] == "engine_unavailable"
    assert await fleet.gateway.usage() == (1, 0, 0)
