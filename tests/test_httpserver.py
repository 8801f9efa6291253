"""What aiohttp refuses before any handler, said in the shape of the listener's API, whatever its size."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from urllib.parse import urlsplit

import attrs
import pytest
from aiohttp import web
from structlog.testing import capture_logs

from llmgw import bodies
from llmgw.bodies import SERVER_OPTIONS
from llmgw.config import AuthConfig, ControlConfig, ServerConfig
from llmgw.gateway.errors import unreadable
from llmgw.httpserver import ListenerRunner
from llmgw.roles.server import ServerHandle, server_role
from tests.servers import loopback_server_config

KIB = 1024
# Host: localhost, a name the admin listener answers to (it answers 421 to others).
HEAD = b"GET {path} HTTP/1.1\r\nHost: localhost\r\n"


@attrs.frozen
class Answer:
    status: int
    content_type: str
    body: object


async def _send(url: str, request: bytes) -> Answer:
    """request written to url's host and port as it is, and the answer read to the connection's end."""
    where = urlsplit(url)
    assert where.hostname is not None and where.port is not None
    reader, writer = await asyncio.open_connection(where.hostname, where.port)
    try:
        # A reset before the answer is read (the server closing with the request unread) fails here.
        writer.write(request)
        await writer.drain()
        answer = await reader.read()
    finally:
        writer.close()
        await writer.wait_closed()
    head, _, body = answer.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = dict(line.split(": ", 1) for line in lines[1:])
    media_type = headers.get("Content-Type", "").partition(";")[0]
    try:
        said: object = json.loads(body)
    except ValueError:
        said = body.decode("latin-1")
    return Answer(int(lines[0].split(" ")[1]), media_type, said)


def _request(path: str, *headers: bytes) -> bytes:
    return HEAD.replace(b"{path}", path.encode()) + b"".join(headers) + b"\r\n"


def _unreadable_requests(path: str) -> list[tuple[str, bytes, int]]:
    """(what it is, the request, the status it is refused with) for requests aiohttp's parser refuses."""
    return [
        ("a URL of 70 KiB", _request(f"{path}?x={'x' * 70 * KIB}"), 414),
        ("a header of 70 KiB", _request(path, b"X-Long: " + b"x" * 70 * KIB + b"\r\n"), 431),
        ("a header of 1 MiB", _request(path, b"X-Long: " + b"x" * KIB * KIB + b"\r\n"), 431),
        ("200 headers", _request(path, *(b"X-%d: y\r\n" % n for n in range(200))), 431),
        ("a Content-Length that is no number", _request(path, b"Content-Length: nope\r\n"), 400),
    ]


def _openai_error(body: object) -> str | None:
    """The message of OpenAI's error object; None when body is not one."""
    if not isinstance(body, dict) or not isinstance(body.get("error"), dict):
        return None
    error = body["error"]
    if set(error) != {"message", "type", "code", "param"} or not isinstance(error["message"], str):
        return None
    return error["message"]


def _admin_error(body: object) -> str | None:
    """The message of the admin API's error ({"error": "..."}); None when body is not one."""
    if not isinstance(body, dict) or set(body) != {"error"} or not isinstance(body["error"], str):
        return None
    return body["error"]


@pytest.fixture
def cfg(tmp_path: Path) -> ServerConfig:
    return loopback_server_config(
        tmp_path, auth=AuthConfig(enabled=False), control=ControlConfig(enabled=False), models=[]
    )


@pytest.fixture
async def server(cfg: ServerConfig) -> AsyncIterator[ServerHandle]:
    with capture_logs():
        async with server_role(cfg) as handle:
            yield handle


async def _refusals(
    base: str, path: str, message_of: Callable[[object], str | None], served: str
) -> list[str]:
    """What is wrong with the listener at base's answers to requests its parser refuses; [] when nothing."""
    problems = []
    for what, request, status in _unreadable_requests(path):
        answer = await _send(base, request)
        if (answer.status, answer.content_type) != (status, "application/json"):
            problems.append(f"{what}: {answer.status} {answer.content_type}, not {status} in JSON")
        if message_of(answer.body) is None:
            problems.append(f"{what}: not in the listener's shape: {answer.body}")
        # The connection refused is closed; the listener goes on serving the next.
        after = await _send(base, _request(served, b"Connection: close\r\n"))
        if after.status != 200:
            problems.append(f"after {what}, {served} answered {after.status}")
    return problems


class TestTheServersListeners:
    async def test_the_gateway_refuses_what_it_cannot_read_in_openais_shape_and_serves_on(
        self, server: ServerHandle
    ) -> None:
        """Past 64 KiB aiohttp's parser answered a 400 in plain text, in no API's shape."""
        problems = await _refusals(server.gateway_url, "/v1/models", _openai_error, "/v1/models")
        assert not problems, "\n".join(problems)

    async def test_the_admin_listener_refuses_what_it_cannot_read_in_the_admin_apis_shape_and_serves_on(
        self, server: ServerHandle
    ) -> None:
        problems = await _refusals(server.admin_url, "/api/v1/status", _admin_error, "/api/v1/status")
        assert not problems, "\n".join(problems)

    async def test_the_refusals_say_what_was_too_long_and_the_bound(self, server: ServerHandle) -> None:
        said = {
            what: _openai_error((await _send(server.gateway_url, request)).body)
            for what, request, _ in _unreadable_requests("/v1/models")
        }
        assert said == {
            "a URL of 70 KiB": "the URL is more than 65,536 bytes; at most 8,190 are taken",
            "a header of 70 KiB": "a header is more than 65,536 bytes; at most 8,190 are taken",
            "a header of 1 MiB": "a header is more than 65,536 bytes; at most 8,190 are taken",
            "200 headers": f"the request has more than {bodies.MAX_HEADERS} headers, the most taken",
            "a Content-Length that is no number": (
                "the request could not be read as HTTP: Invalid character in Content-Length"
            ),
        }


async def test_a_handlers_failure_is_a_500_in_the_listeners_shape() -> None:
    """aiohttp's own 500 was "500 Internal Server Error / Server got itself in trouble" in plain text."""

    async def fails(request: web.Request) -> web.Response:
        raise RuntimeError("a fault of the server's")

    app = web.Application()
    app.router.add_get("/fails", fails)
    runner = ListenerRunner(app, unreadable, access_log=None, **SERVER_OPTIONS)
    await runner.setup()
    try:
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        host, port = runner.addresses[0][:2]
        with capture_logs():
            answer = await _send(f"http://{host}:{port}", _request("/fails"))
    finally:
        await runner.cleanup()
    assert (answer.status, answer.content_type) == (500, "application/json")
    assert _openai_error(answer.body) == "the server failed while answering this request; its log says why"
