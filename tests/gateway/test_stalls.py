"""Engines that stall, hang or misbehave mid-request: timeouts, a retry elsewhere, clean errors, fair usage.

The fake engine (an aiohttp app on a loopback port) misbehaves on demand; the
sim engine runs as a real subprocess where the issue needs a real stall
(SIGSTOP). Timeouts are small in the test config; nothing waits on the clock.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
import attrs
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from structlog.testing import capture_logs

from llmgw.bodies import SERVER_OPTIONS
from llmgw.catalog import Catalog
from llmgw.config import ModelConfig, RouterConfig, ServerConfig, TimeoutsConfig
from llmgw.gateway.admission import Admission
from llmgw.gateway.app import ROUTER_KEY, make_gateway_app
from llmgw.gateway.auth import KeyCache
from llmgw.gateway.quotas import Quotas
from llmgw.gateway.usage import UsageRecorder
from llmgw.routes import EngineRoute
from llmgw.store import Store
from llmgw.store.keys import create_key
from llmgw.store.usage import usage_by_day

from ..waiting import eventually, eventually_async
from .conftest import MODEL, FakeReplicas

CHAT = "/v1/chat/completions"
TIMEOUTS = TimeoutsConfig(connect_s=2, first_byte_s=0.5, idle_s=0.5, total_s=30)
HTML = b"<html><body><h1>502 Bad Gateway</h1><hr>nginx</body></html>"
EVENT = b'data: {"choices":[{"index":0,"delta":{"content":"w"}}]}\n\n'


@attrs.define
class Misbehaving:
    """An engine that does, on each request, what `mode` says."""

    mode: str = "ok"
    requests: int = 0
    never: asyncio.Event = attrs.field(factory=asyncio.Event)

    async def chat(self, request: web.Request) -> web.StreamResponse:
        await request.read()
        self.requests += 1
        mode = self.mode
        if mode == "500-text":
            return web.Response(status=500, text="Internal Server Error: worker died")
        if mode == "502-html":
            return web.Response(status=502, body=HTML, content_type="text/html")
        if mode == "200-not-json":
            return web.Response(body=HTML, content_type="text/html")
        if mode == "silent":
            await self.never.wait()
        if mode == "ok":
            usage = {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}
            return web.json_response({"object": "chat.completion", "choices": [], "usage": usage})
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(EVENT * 3)
        if mode == "bad-sse":
            await response.write(b"data: <html>oops</html>\n\n")
            await self.never.wait()
        elif mode == "cut":
            assert request.transport is not None
            request.transport.close()  # mid-stream, no end: a truncated body
        elif mode == "stall":
            await self.never.wait()
        elif mode == "trickle":
            # An engine generating on, a token at a time, until its client's connection closes.
            while not self.never.is_set():
                await asyncio.sleep(0.05)
                await response.write(EVENT)
        return response


@attrs.define
class Rig:
    client: TestClient[web.Request, web.Application]
    replicas: FakeReplicas
    recorder: UsageRecorder
    store: Store
    key: str
    refused: list[str]

    async def post(self, body: dict[str, Any]) -> aiohttp.ClientResponse:
        return await self.client.post(CHAT, json=body, headers={"Authorization": f"Bearer {self.key}"})

    async def usage(self) -> tuple[int, int, int]:
        await self.recorder.flush(self.store)
        rows = await usage_by_day(self.store)
        return (
            sum(r.requests for r in rows),
            sum(r.prompt_tokens for r in rows),
            sum(r.completion_tokens for r in rows),
        )


RigFactory = Callable[..., Awaitable[Rig]]


class _AsServed(TestServer):
    """The gateway's app run as roles/server.py runs it: a client that leaves is found by a failed write.

    TestServer cancels the handler of a client that leaves; the gateway's runner does not.
    """

    def __init__(self, app: web.Application) -> None:
        super().__init__(app, host="127.0.0.1", port=0)

    async def _make_runner(self, **kwargs: Any) -> web.BaseRunner:
        return web.AppRunner(self.app, **{**kwargs, **SERVER_OPTIONS, "handler_cancellation": False})


@pytest.fixture
async def rig(store: Store) -> AsyncIterator[RigFactory]:
    """A gateway with admission whose model has small timeouts, in front of the given engines."""
    clients: list[TestClient[web.Request, web.Application]] = []

    async def make(engines: list[str], cancels_handlers: bool = True) -> Rig:
        cfg = ServerConfig(
            models=[ModelConfig(name=MODEL, max_tokens=64, timeouts=TIMEOUTS)],
            # Replicas tied at zero in flight take turns, whatever the prompt.
            router=RouterConfig(policy="least_in_flight"),
        )
        replicas = FakeReplicas(endpoints={MODEL: list(engines)})
        refused: list[str] = []
        for i, url in enumerate(engines):

            def refuse(reason: str, url: str = url) -> None:
                # As the inventory does: an engine the gateway found dead leaves the table.
                refused.append(url)
                replicas.endpoints[MODEL] = [e for e in replicas.endpoints[MODEL] if e != url]

            lost = asyncio.get_running_loop().create_future()
            replicas.routes[url] = EngineRoute(f"node{i}", f"replica{i}", "", lost, refuse)
        keys, recorder = KeyCache(), UsageRecorder()
        quotas = Quotas(recorder)
        catalog = Catalog(cfg)
        app = make_gateway_app(cfg, catalog, replicas, keys, Admission(cfg, catalog, quotas, recorder))
        server = TestServer(app, host="127.0.0.1", port=0) if cancels_handlers else _AsServed(app)
        client = TestClient(server)
        await client.start_server()
        clients.append(client)
        plaintext, _ = await create_key(store, "k")
        await keys.refresh(store)
        await quotas.refresh(store)
        return Rig(client, replicas, recorder, store, plaintext, refused)

    yield make
    for client in clients:
        await client.close()


@pytest.fixture
async def fakes() -> AsyncIterator[list[tuple[Misbehaving, str]]]:
    """Two misbehaving engines, well-behaved until told otherwise."""
    made: list[tuple[Misbehaving, TestServer]] = []
    for _ in range(2):
        fake = Misbehaving()
        app = web.Application()
        app.router.add_post(CHAT, fake.chat)
        server = TestServer(app, host="127.0.0.1", port=0)
        await server.start_server()
        made.append((fake, server))
    yield [(fake, f"http://127.0.0.1:{server.port}") for fake, server in made]
    for fake, server in made:
        fake.never.set()
        await server.close()


def _chat(stream: bool = False, **more: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "stream": stream, **more}


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


class TestMisbehavingEngines:
    @pytest.mark.parametrize("mode", ["500-text", "502-html", "200-not-json"])
    async def test_an_engine_reply_no_client_can_parse_is_a_502_in_openai_shape_naming_the_replica(
        self, rig: RigFactory, fakes: list[tuple[Misbehaving, str]], mode: str
    ) -> None:
        fake, url = fakes[0]
        fake.mode = mode
        gw = await rig([url])
        with capture_logs() as logs:
            resp = await gw.post(_chat())
        assert resp.status == 502
        assert resp.content_type == "application/json"
        error = (await resp.json())["error"]
        assert error["message"].startswith(f"{MODEL} on node0 ")
        assert error["type"] == "server_error"
        logged = [e for e in logs if e.get("replica") == "replica0"]
        assert logged and logged[0]["sent"][:20] in (HTML + b"Internal Server Error").decode()
        # Nothing was delivered: nothing is charged.
        assert await gw.usage() == (1, 0, 0)

    async def test_a_malformed_stream_ends_with_an_error_event_naming_the_replica(
        self, rig: RigFactory, fakes: list[tuple[Misbehaving, str]]
    ) -> None:
        fake, url = fakes[0]
        fake.mode = "bad-sse"
        gw = await rig([url])
        resp = await gw.post(_chat(stream=True))
        assert resp.status == 200
        events = _events(await _read_cut(resp))
        assert len(events) == 4 and "error" in events[-1]
        assert (
            events[-1]["error"]["message"]
            == f"{MODEL} on node0 broke off its reply: it sent an event that is not JSON"
        )

    async def test_a_stream_cut_midway_ends_with_an_error_event_saying_what_the_engine_did(
        self, rig: RigFactory, fakes: list[tuple[Misbehaving, str]]
    ) -> None:
        fake, url = fakes[0]
        fake.mode = "cut"
        gw = await rig([url])
        with capture_logs() as logs:
            resp = await gw.post(_chat(stream=True))
            events = _events(await _read_cut(resp))
        # The engine's end in the product's words; aiohttp's ("Response payload is not completed:
        # <TransferEncodingError ...>") only in the log.
        assert events[-1]["error"]["message"] == (
            f"the engine for {MODEL} on node0 closed the connection mid-reply after 3 tokens"
        )
        [logged] = [e for e in logs if e["event"] == "the engine broke a stream under way"]
        assert "TransferEncodingError" in logged["error"]
        # Three events delivered, no usage reported: three completion tokens, not the 64 reserved.
        requests, _, completion = await gw.usage()
        assert (requests, completion) == (1, 3)


class TestAClientThatLeaves:
    @pytest.mark.parametrize("cancels_handlers", [True, False], ids=["handler-cancelled", "write-fails"])
    async def test_mid_stream_is_charged_what_it_was_sent_not_its_reservation(
        self, rig: RigFactory, fakes: list[tuple[Misbehaving, str]], cancels_handlers: bool
    ) -> None:
        fake, url = fakes[0]
        fake.mode = "trickle"
        gw = await rig([url], cancels_handlers=cancels_handlers)
        resp = await gw.post(_chat(stream=True))
        read = b""
        while read.count(b"\n\n") < 5:
            read += await resp.content.readany()
        resp.close()

        usage: list[tuple[int, int, int]] = []

        async def charged() -> bool:
            usage[:] = [await gw.usage()]
            return usage[0][0] > 0

        await eventually_async(charged)
        [(requests, _, completion)] = usage
        # The engine reported no usage (it would have, at its end): a token for each event the gateway
        # passed on, at least the five the client read; not the 64 of max_tokens reserved.
        assert requests == 1
        assert 5 <= completion < 64


class TestTimeouts:
    async def test_an_engine_that_sends_nothing_is_a_504_naming_model_node_and_timeout(
        self, rig: RigFactory, fakes: list[tuple[Misbehaving, str]]
    ) -> None:
        fake, url = fakes[0]
        fake.mode = "silent"
        gw = await rig([url])
        resp = await gw.post(_chat())
        assert resp.status == 504
        error = (await resp.json())["error"]
        assert error["message"] == f"{MODEL} on node0 sent nothing for 0.5 s (timeouts.first_byte_s)"
        assert error["code"] == "engine_timeout"
        # It leaves routing: its agent may still say ready, but it does not answer the gateway.
        assert gw.refused == [url]
        assert await gw.usage() == (1, 0, 0)

    async def test_a_stream_that_stalls_ends_with_an_error_event_naming_idle_s(
        self, rig: RigFactory, fakes: list[tuple[Misbehaving, str]]
    ) -> None:
        fake, url = fakes[0]
        fake.mode = "stall"
        gw = await rig([url])
        resp = await gw.post(_chat(stream=True))
        events = _events(await _read_cut(resp))
        assert (
            events[-1]["error"]["message"]
            == f"{MODEL} on node0 sent nothing more for 0.5 s (timeouts.idle_s)"
        )
        assert (await gw.usage())[::2] == (1, 3)


class TestRetryElsewhere:
    @pytest.mark.parametrize("mode", ["500-text", "502-html", "silent"])
    async def test_a_replica_that_fails_before_the_first_byte_hands_the_request_to_another_once(
        self, rig: RigFactory, fakes: list[tuple[Misbehaving, str]], mode: str
    ) -> None:
        (bad, bad_url), (_, good_url) = fakes
        bad.mode = mode
        gw = await rig([bad_url, good_url])
        # Of four requests, some go to the bad one first.
        for _ in range(4):
            resp = await gw.post(_chat())
            assert resp.status == 200
            assert resp.headers["x-llmgw-replica"] == "replica1"
        assert bad.requests >= 1
        # One admission, one settlement per request, whatever the tries.
        requests, prompt, completion = await gw.usage()
        assert (prompt, completion) == (3 * requests, 2 * requests)

    async def test_a_second_failure_is_the_answer_not_a_third_try(
        self, rig: RigFactory, fakes: list[tuple[Misbehaving, str]]
    ) -> None:
        for fake, _ in fakes:
            fake.mode = "500-text"
        gw = await rig([url for _, url in fakes])
        resp = await gw.post(_chat())
        assert resp.status == 502
        assert [fake.requests for fake, _ in fakes] == [1, 1]
        assert await gw.usage() == (1, 0, 0)


# The sim engine as a real process: SIGSTOP leaves its port open and its requests unanswered.


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@pytest.fixture
async def sims() -> AsyncIterator[Callable[[int], Awaitable[list[tuple[asyncio.subprocess.Process, str]]]]]:
    started: list[asyncio.subprocess.Process] = []

    async def start(count: int) -> list[tuple[asyncio.subprocess.Process, str]]:
        out = []
        for _ in range(count):
            port = _free_port()
            argv = ["-m", "llmgw.engines.sim", "--port", str(port), "--model", MODEL]
            proc = await asyncio.create_subprocess_exec(
                sys.executable,
                *argv,
                "--ttft-ms",
                "1",
                "--tokens-per-s",
                "40",
                stderr=asyncio.subprocess.PIPE,
            )
            started.append(proc)
            assert proc.stderr is not None
            assert b"serving" in await asyncio.wait_for(proc.stderr.readline(), 30)
            out.append((proc, f"http://127.0.0.1:{port}"))
        return out

    yield start
    for proc in started:
        if proc.returncode is None:
            os.kill(proc.pid, signal.SIGCONT)
            proc.terminate()
            await proc.wait()


SimsFactory = Callable[[int], Awaitable[list[tuple[asyncio.subprocess.Process, str]]]]


async def _in_flight(url: str) -> float:
    async with aiohttp.ClientSession() as session, session.get(url + "/metrics") as resp:
        for line in (await resp.text()).splitlines():
            if line.startswith("llmgw_sim_requests_in_flight "):
                return float(line.split()[1])
    raise AssertionError("the sim has no in-flight count")


class TestStalledSimEngine:
    async def test_a_stopped_engine_is_a_504_before_the_first_byte(
        self, rig: RigFactory, sims: SimsFactory
    ) -> None:
        [(proc, url)] = await sims(1)
        gw = await rig([url])
        os.kill(proc.pid, signal.SIGSTOP)
        resp = await gw.post(_chat())
        assert resp.status == 504
        assert "(timeouts.first_byte_s)" in (await resp.json())["error"]["message"]

    async def test_an_engine_stopped_mid_stream_ends_it_with_an_error_event(
        self, rig: RigFactory, sims: SimsFactory
    ) -> None:
        [(proc, url)] = await sims(1)
        gw = await rig([url])
        resp = await gw.post(
            _chat(stream=True, max_tokens=40, messages=[{"role": "user", "content": "w " * 40}])
        )
        assert resp.status == 200
        first = await resp.content.readuntil(b"\n\n")
        os.kill(proc.pid, signal.SIGSTOP)
        events = _events(first + await _read_cut(resp))
        assert events[-1]["error"]["message"].endswith("(timeouts.idle_s)")
        requests, _, completion = await gw.usage()
        assert requests == 1 and 1 <= completion < 40

    async def test_a_client_that_leaves_mid_stream_stops_the_engine_generating(
        self, rig: RigFactory, sims: SimsFactory
    ) -> None:
        [(_, url)] = await sims(1)
        gw = await rig([url])
        body = _chat(stream=True, max_tokens=64, messages=[{"role": "user", "content": "w " * 64}])
        resp = await gw.post(body)
        await resp.content.readuntil(b"\n\n")
        assert await _in_flight(url) == 1
        resp.close()
        # 64 tokens at 40 a second would keep it busy well past this; it stops when the client goes.
        await eventually(lambda: gw.recorder.pending())
        assert await _poll_in_flight_zero(url)

    async def test_under_steady_load_a_stalled_replica_fails_only_the_streams_already_on_it(
        self, rig: RigFactory, sims: SimsFactory
    ) -> None:
        (stalled, stalled_url), (_, healthy_url) = await sims(2)
        gw = await rig([stalled_url, healthy_url])
        router = gw.client.app[ROUTER_KEY]
        results: list[tuple[int, int, str, bool]] = []  # (sent at, status, replica, ended with an error)
        stop_at, total = 20, 100
        on_stalled_at_stop = -1

        async def one(i: int) -> None:
            resp = await gw.post(
                _chat(stream=True, max_tokens=6, messages=[{"role": "user", "content": "a b c d e f"}])
            )
            try:
                body = await resp.read()
                failed = b'"error"' in body
            except aiohttp.ClientPayloadError:
                failed = True
            results.append((i, resp.status, resp.headers.get("x-llmgw-replica", ""), failed))

        async with asyncio.TaskGroup() as group:
            for i in range(total):
                if i == stop_at:
                    on_stalled_at_stop = router.in_flight.get(stalled_url, 0)
                    os.kill(stalled.pid, signal.SIGSTOP)
                group.create_task(one(i))
                await asyncio.sleep(0.05)  # pacing: 20 requests a second
        failed = [r for r in results if r[1] != 200 or r[3]]
        print(
            f"\n{total} requests at 20/s, one of two replicas stopped after {stop_at}: "
            f"{len(failed)} failed, {on_stalled_at_stop} were on it when it stopped"
        )
        assert all(status == 200 for _, status, _, _ in results)
        # Only streams already under way on the stalled replica fail; everything sent after the stop succeeds.
        assert all(i < stop_at and replica == "replica0" for i, _, replica, _ in failed)
        assert len(failed) <= on_stalled_at_stop
        assert all(replica == "replica1" for i, _, replica, bad in results if i >= stop_at and not bad)


async def _poll_in_flight_zero(url: str) -> bool:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 10
    while await _in_flight(url) != 0:
        if loop.time() > deadline:
            return False
        await asyncio.sleep(0.01)
    return True
