"""Bodies that are not what they say: a 4xx in the API's own shape, at once, and never a traceback."""

from __future__ import annotations

import ast
import asyncio
import contextlib
import gzip
import io
import json
import logging
import zlib
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
import structlog
from aiohttp import web

from llmgw import bodies
from llmgw.bodies import SERVER_OPTIONS
from llmgw.catalog import Catalog
from llmgw.config import AuthConfig, ModelConfig, ServerConfig
from llmgw.config.yamltext import read_yaml
from llmgw.control.inventory import Inventory
from llmgw.gateway.app import make_gateway_app
from llmgw.gateway.auth import KeyCache
from llmgw.gateway.errors import unreadable
from llmgw.httpserver import ListenerRunner, Refusal
from llmgw.store import open_store
from llmgw.web import admin_listener
from llmgw.web.admin_listener import make_admin_app
from llmgw.web.app import mount_pages
from llmgw.web.context import WebContext

from .threaded import ErrorRecords, error_records

JSON = {"Content-Type": "application/json"}
CHAT = b'{"model": "sim-chat", "messages": [{"role": "user", "content": "hi"}]}'
YAML = {"Content-Type": "application/yaml"}


@pytest.fixture
def tracebacks() -> AsyncIterator[ErrorRecords]:
    with error_records() as records:
        yield records  # type: ignore[misc]
    assert [r.getMessage() for r in records.records] == [], "a request made the server log an error"


@pytest.fixture
async def urls(tmp_path: Path) -> AsyncIterator[tuple[str, str]]:
    """(the gateway's URL, the admin listener's), served as the server serves them."""
    cfg = ServerConfig(
        models=[ModelConfig(name="sim-chat")], auth=AuthConfig(enabled=False), admin_listen="127.0.0.1:0"
    )
    async with open_store(tmp_path / "llmgw.db") as store:
        catalog, inventory = Catalog(cfg, store), Inventory(5.0)
        pages = WebContext(cfg=cfg, store=store)
        gateway_app = make_gateway_app(cfg, catalog, inventory, KeyCache())
        mount_pages(gateway_app, pages)
        admin_app = make_admin_app(cfg, inventory, catalog, pages)
        async with (
            _served(gateway_app, unreadable) as gateway,
            _served(admin_app, admin_listener.unreadable) as admin,
        ):
            yield gateway, admin


@contextlib.asynccontextmanager
async def _served(app: web.Application, refuse: Refusal) -> AsyncIterator[str]:
    """app on a loopback port as the server role serves its listeners; its URL."""
    runner = ListenerRunner(app, refuse, access_log=None, **SERVER_OPTIONS)
    await runner.setup()
    try:
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        host, port = runner.addresses[0][:2]
        yield f"http://{host}:{port}"
    finally:
        await runner.cleanup()


async def _post(url: str, body: bytes, headers: dict[str, str]) -> tuple[int, str, object]:
    async with (
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=20)) as session,
        session.post(url, data=body, headers=headers) as reply,
    ):
        return reply.status, reply.content_type, await reply.json(content_type=None)


def _openai_error(body: object) -> str:
    assert isinstance(body, dict) and isinstance(body["error"], dict), body
    assert {"message", "type", "code", "param"} <= body["error"].keys()
    return str(body["error"]["message"])


class TestContentEncoding:
    async def test_a_body_that_says_gzip_and_is_not_is_a_400_in_openais_shape(
        self, urls: tuple[str, str], tracebacks: ErrorRecords
    ) -> None:
        status, kind, body = await _post(
            f"{urls[0]}/v1/chat/completions", b"not gzip at all", {**JSON, "Content-Encoding": "gzip"}
        )
        assert (status, kind) == (400, "application/json")
        assert "is not gzip as its Content-Encoding says" in _openai_error(body)

    async def test_a_gzip_body_is_decoded_for_the_gateway(
        self, urls: tuple[str, str], tracebacks: ErrorRecords
    ):
        status, _, body = await _post(
            f"{urls[0]}/v1/chat/completions", gzip.compress(CHAT), {**JSON, "Content-Encoding": "gzip"}
        )
        # Read and understood: the model is named, and it has no replica here.
        assert status == 503 and "no ready replica" in _openai_error(body)

    @pytest.mark.parametrize("raw", [True, False], ids=["raw deflate", "zlib deflate"])
    async def test_a_deflate_body_cut_short_is_refused_at_once(
        self, urls: tuple[str, str], tracebacks: ErrorRecords, raw: bool
    ) -> None:
        """It left the request waiting for the rest for ever, holding its connection."""
        packed = zlib.compress(CHAT)
        body = (packed[2:-4] if raw else packed)[:20]
        status, _, reply = await _post(
            f"{urls[0]}/v1/chat/completions", body, {**JSON, "Content-Encoding": "deflate"}
        )
        assert status == 400 and "cut short" in _openai_error(reply)

    async def test_a_body_that_decodes_past_the_limit_is_a_413(
        self, urls: tuple[str, str], tracebacks: ErrorRecords
    ) -> None:
        bomb = gzip.compress(b"\0" * (2 * 1024 * 1024))
        status, _, body = await _post(f"{urls[1]}/api/v1/models", bomb, {**YAML, "Content-Encoding": "gzip"})
        assert status == 413 and "decodes to more than" in str(body)

    async def test_a_coding_the_server_does_not_know_is_a_415_in_the_apis_shape(
        self, urls: tuple[str, str], tracebacks: ErrorRecords
    ) -> None:
        for coding in ("br", "zstd", "x-unknown"):
            status, _, body = await _post(
                f"{urls[0]}/v1/chat/completions", CHAT, {**JSON, "Content-Encoding": coding}
            )
            assert status == 415 and f"Content-Encoding {coding} is not one" in _openai_error(body)
            status, _, body = await _post(
                f"{urls[1]}/api/v1/models", b"name: x", {**YAML, "Content-Encoding": coding}
            )
            assert status == 415 and isinstance(body, dict) and isinstance(body["error"], str)


class TestText:
    async def test_a_model_definition_that_is_not_utf8_is_a_400_in_the_admin_apis_shape(
        self, urls: tuple[str, str], tracebacks: ErrorRecords
    ) -> None:
        status, _, body = await _post(f"{urls[1]}/api/v1/models", b"name: caf\xe9\n", YAML)
        assert (status, body) == (
            400,
            {"error": "the request body is not utf-8 text (byte 10 is not); send it as UTF-8"},
        )

    async def test_a_charset_that_does_not_exist_is_a_400(
        self, urls: tuple[str, str], tracebacks: ErrorRecords
    ):
        status, _, body = await _post(
            f"{urls[1]}/api/v1/models", b"name: x", {"Content-Type": "application/yaml; charset=klingon"}
        )
        assert status == 400 and "charset (klingon)" in str(body)

    async def test_a_nul_in_a_model_definition_is_a_400(
        self, urls: tuple[str, str], tracebacks: ErrorRecords
    ):
        status, _, body = await _post(f"{urls[1]}/api/v1/models", b"\x00", YAML)
        assert status == 400 and "not valid YAML" in str(body)

    async def test_a_form_that_is_not_utf8_or_not_multipart_is_a_400(
        self, urls: tuple[str, str], tracebacks: ErrorRecords
    ) -> None:
        for body, kind in (
            (b"email=%ff&password=\xff", "application/x-www-form-urlencoded"),
            (b"--x\r\n", "multipart/form-data; boundary=x"),
        ):
            status, _, reply = await _post(f"{urls[0]}/login", body, {"Content-Type": kind})
            assert status == 400 and "the form could not be read" in _openai_error(reply)


class TestMethodsAndPaths:
    async def test_a_method_no_route_takes_is_a_405_and_a_delete_needs_no_body(
        self, urls: tuple[str, str], tracebacks: ErrorRecords
    ) -> None:
        async with aiohttp.ClientSession() as session:
            async with session.request("TRACE", f"{urls[1]}/api/v1/status") as reply:
                assert reply.status == 405
                assert await reply.json() == {"error": "/api/v1/status does not accept TRACE"}
            async with session.delete(f"{urls[1]}/api/v1/models/nope") as reply:
                assert reply.status == 404, "a DELETE with no body was a 415"
            # POST is what a page elsewhere can send without asking: it still needs JSON.
            async with session.post(f"{urls[1]}/api/v1/weights/collect") as reply:
                assert reply.status == 415

    async def test_a_trailing_slash_leads_where_the_path_without_it_does(
        self, urls: tuple[str, str], tracebacks: ErrorRecords
    ) -> None:
        async with aiohttp.ClientSession() as session:
            for url, where in ((f"{urls[0]}/admin/", "/admin"), (f"{urls[1]}/models/", "/models")):
                async with session.get(url, allow_redirects=False) as reply:
                    assert (reply.status, reply.headers["Location"]) == (308, where)

    @pytest.mark.parametrize("query", ["lines=0", "lines=99999", "lines=ten", "follow=2"])
    async def test_a_logs_page_link_it_cannot_honour_is_a_400(
        self, urls: tuple[str, str], tracebacks: ErrorRecords, query: str
    ) -> None:
        async with (
            aiohttp.ClientSession() as session,
            session.get(f"{urls[1]}/nodes/n1/logs?{query}") as reply,
        ):
            assert reply.status == 400 and "This link is not right" in await reply.text()


class TestLongLines:
    """A URL or header past 8,190 bytes was aiohttp's 400 in plain text, in no API's shape."""

    async def test_a_url_past_the_bound_is_a_414_in_the_apis_shape(
        self, urls: tuple[str, str], tracebacks: ErrorRecords
    ) -> None:
        long = "x" * bodies.MAX_LINE
        async with aiohttp.ClientSession() as session:
            async with session.get(f"{urls[0]}/v1/models/{long}") as reply:
                assert reply.status == 414
                assert _openai_error(await reply.json()) == "the URL is 8,201 bytes; at most 8,190 are taken"
            async with session.get(f"{urls[0]}/admin/api/v1/models/{long}") as reply:
                assert (reply.status, await reply.json()) == (
                    414,
                    {"error": "the URL is 8,211 bytes; at most 8,190 are taken"},
                )
            async with session.get(f"{urls[1]}/api/v1/status?x={long}") as reply:
                assert reply.status == 414 and "at most 8,190" in (await reply.json())["error"]

    async def test_a_header_past_the_bound_is_a_431_in_the_apis_shape(
        self, urls: tuple[str, str], tracebacks: ErrorRecords
    ) -> None:
        async with aiohttp.ClientSession() as session:
            long = {"X-Long": "x" * bodies.MAX_LINE}
            async with session.get(f"{urls[0]}/v1/models", headers=long) as reply:
                assert reply.status == 431
                assert (
                    _openai_error(await reply.json())
                    == "the header X-Long is 8,198 bytes; at most 8,190 are taken"
                )
            async with session.get(f"{urls[1]}/api/v1/status", headers=long) as reply:
                assert reply.status == 431 and "the header X-Long" in (await reply.json())["error"]
            # Up to the bound is taken.
            async with session.get(f"{urls[0]}/v1/models", headers={"X-Long": "x" * 8000}) as reply:
                assert reply.status == 200

    async def test_past_what_the_parser_reads_it_is_a_431_in_the_apis_shape_without_a_traceback(
        self, urls: tuple[str, str], tracebacks: ErrorRecords
    ) -> None:
        """The parser refused it itself, with a 400 in plain text (tests/test_httpserver.py: every size)."""
        long = {"X-Long": "x" * (bodies.MAX_PARSED_FIELD + 1)}
        async with aiohttp.ClientSession() as session:
            async with session.get(f"{urls[0]}/v1/models", headers=long) as reply:
                assert (reply.status, reply.content_type) == (431, "application/json")
                assert "a header is more than 65,536 bytes" in _openai_error(await reply.json())
            async with session.get(f"{urls[1]}/api/v1/status", headers=long) as reply:
                assert (reply.status, reply.content_type) == (431, "application/json")
                assert "a header is more than 65,536 bytes" in (await reply.json())["error"]


async def test_a_request_aiohttp_cannot_parse_is_logged_as_one_line_not_a_traceback(
    urls: tuple[str, str], caplog: pytest.LogCaptureFixture
) -> None:
    host, port = urls[0].removeprefix("http://").split(":")
    with structlog.testing.capture_logs() as logged, caplog.at_level(logging.DEBUG):
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: nope\r\n\r\n")
        await writer.drain()
        answer = await reader.read()
        writer.close()
        await writer.wait_closed()
    assert answer.split(b"\r\n")[0].endswith(b" 400 Bad Request")
    assert not [r for r in caplog.records if r.exc_info]
    assert [e["event"] for e in logged] == ["refused a request that could not be read"]


DEEP = b"[" * 1000 + b"]" * 1000


async def _send(method: str, url: str, body: bytes, headers: dict[str, str]) -> tuple[int, object]:
    async with (
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session,
        session.request(method, url, data=io.BytesIO(body), headers=headers) as reply,
    ):
        return reply.status, await reply.json(content_type=None)


class TestJson:
    """Every JSON route reads its body with bodies.read_json: one depth rule, one character rule."""

    async def test_json_nested_a_thousand_deep_is_a_400_on_every_gateway_route(
        self, urls: tuple[str, str], tracebacks: ErrorRecords
    ) -> None:
        """It was a RecursionError in read_request: a 500 and a traceback."""
        for path in ("/v1/chat/completions", "/v1/completions", "/v1/embeddings"):
            for body in (DEEP, b'{"model": "sim-chat", "x": ' + DEEP + b"}"):
                status, _, reply = await _post(f"{urls[0]}{path}", body, JSON)
                assert status == 400 and "nests deeper than 64 levels" in _openai_error(reply), path

    async def test_a_gzip_of_thirty_megabytes_of_brackets_is_a_400_on_the_gateway(
        self, urls: tuple[str, str], tracebacks: ErrorRecords
    ) -> None:
        bomb = gzip.compress(b"[" * (30 * 1024 * 1024))
        status, _, reply = await _post(
            f"{urls[0]}/v1/chat/completions", bomb, {**JSON, "Content-Encoding": "gzip"}
        )
        assert status == 400 and "nests deeper" in _openai_error(reply)

    async def test_json_nested_a_thousand_deep_is_a_400_on_every_admin_route_that_reads_json(
        self, urls: tuple[str, str], tracebacks: ErrorRecords
    ) -> None:
        """Each was a RecursionError from request.json(): a 500 and a traceback (the bench route last)."""
        admin = urls[1]
        assert (await _send("POST", f"{admin}/api/v1/orgs", b'{"name": "acme"}', JSON))[0] == 201
        for method, path in (
            ("POST", "/api/v1/orgs"),
            ("POST", "/api/v1/teams"),
            ("POST", "/api/v1/projects"),
            ("POST", "/api/v1/nodes/gpu-01/state"),
            ("PATCH", "/api/v1/orgs/acme"),
            ("PUT", "/api/v1/quotas/org:1"),
            ("PUT", "/api/v1/prices/sim-chat"),
            ("POST", "/api/v1/models/sim-chat/bench"),
        ):
            status, reply = await _send(method, f"{admin}{path}", DEEP, JSON)
            if path.startswith("/api/v1/nodes"):
                assert status == 404, reply  # no such node: said before its body is read
                continue
            assert status == 400 and isinstance(reply, dict), (path, reply)
            assert "nests deeper than 64 levels" in reply["error"], (path, reply)

    async def test_json_as_deep_as_the_rule_allows_is_read(self) -> None:
        assert bodies.parse_json(b"[" * bodies.MAX_DEPTH + b"]" * bodies.MAX_DEPTH) is not None
        assert bodies.parse_json(b'["[[[[", {"a": "]]]]"}]') == ["[[[[", {"a": "]]]]"}]
        with pytest.raises(bodies.BadJson, match="nests deeper"):
            bodies.parse_json(b"[" * (bodies.MAX_DEPTH + 1) + b"]" * (bodies.MAX_DEPTH + 1))

    def test_depth_counts_nesting_not_brackets_in_text_or_side_by_side(self) -> None:
        """Past MAX_DEPTH brackets in all, a body is judged by its nesting, not its strings or siblings."""
        many = bodies.MAX_DEPTH * 2
        siblings = b"[" + b",".join([b'{"a": [1]}'] * many) + b"]"
        assert len(bodies.parse_json(siblings)) == many
        in_text = b'{"a": ["' + b"[{" * many + b'\\"' + b"[" * many + b'"]}'
        assert bodies.parse_json(in_text)["a"][0].startswith("[{")
        level = bodies.MAX_DEPTH
        deep = b'{"t": "' + b"[" * many + b'", "d": ' + b"[" * level + b"]" * level + b"}"
        with pytest.raises(bodies.BadJson, match="nests deeper"):
            bodies.parse_json(deep)
        just = b"[" * (bodies.MAX_DEPTH - 1) + b'"' + b"[" * many + b'"' + b"]" * (bodies.MAX_DEPTH - 1)
        assert bodies.parse_json(just) is not None

    def test_a_whole_number_of_more_than_a_hundred_digits_is_refused_in_words(self) -> None:
        """Python reads up to 4,300 digits and then refused in words about its own interpreter."""
        with pytest.raises(bodies.BadJson, match="a whole number of 5,001 digits; at most 100") as refused:
            bodies.parse_json(b'{"rpm": 1' + b"0" * 5000 + b"}")
        assert refused.value.status == 400 and not refused.value.not_json
        assert bodies.parse_json(b'{"seed": 18446744073709551615}') == {"seed": 2**64 - 1}

    @pytest.mark.parametrize("number", [b"NaN", b"Infinity", b"-Infinity", b"1e400", b"-1e400"])
    async def test_a_number_json_cannot_carry_is_a_400_on_the_gateway_and_the_admin_api(
        self, urls: tuple[str, str], tracebacks: ErrorRecords, number: bytes
    ) -> None:
        """Python reads NaN, Infinity and 1e400 (as inf); written back, each is text no JSON reader takes."""
        said = f"the request body holds the number {number.decode()}, which JSON cannot carry"
        chat = CHAT[:-1] + b', "temperature": ' + number + b"}"
        status, _, reply = await _post(f"{urls[0]}/v1/chat/completions", chat, JSON)
        assert status == 400 and said in _openai_error(reply)
        status, reply = await _send(
            "PUT", f"{urls[1]}/api/v1/quotas/org:1", b'{"budget": ' + number + b"}", JSON
        )
        assert status == 400 and isinstance(reply, dict) and said in reply["error"]
        assert bodies.parse_json(b"[1e308, -1e308, 5e-324]") == [1e308, -1e308, 5e-324]

    async def test_an_escaped_surrogate_pair_is_one_character_and_a_lone_half_is_refused(
        self, urls: tuple[str, str], tracebacks: ErrorRecords
    ) -> None:
        """A pair was refused as "half a character" in a model definition sent as JSON."""
        model = {"name": "sim-emoji", "version": "\U0001f600", "profiles": [{"engine": "sim"}]}
        pair = json.dumps(model).encode()
        assert b"\\ud83d\\ude00" in pair
        status, reply = await _send("POST", f"{urls[1]}/api/v1/models", pair, JSON)
        assert status == 201, reply
        assert await asyncio.to_thread(read_yaml, pair.decode(), "x") == model
        half = pair.replace(b"\\ude00", b"")
        status, reply = await _send("POST", f"{urls[1]}/api/v1/models", half, JSON)
        assert status == 400 and "half a character" in str(reply)
        status, reply = await _send("POST", f"{urls[1]}/api/v1/orgs", b'{"name": "a\\udc00"}', JSON)
        assert status == 400 and "half a character" in str(reply)
        status, reply = await _send("POST", f"{urls[1]}/api/v1/orgs", b'{"name": "a\\ud83d\\ude00"}', JSON)
        assert status == 201 and isinstance(reply, dict) and reply["name"] == "a\U0001f600"

    async def test_an_admin_change_past_a_mebibyte_is_a_413(
        self, urls: tuple[str, str], tracebacks: ErrorRecords
    ) -> None:
        big = json.dumps({"name": "x" * (2 * 1024 * 1024)}).encode()
        status, reply = await _send("POST", f"{urls[1]}/api/v1/orgs", big, JSON)
        assert status == 413 and isinstance(reply, dict) and "the most this route takes" in reply["error"]


class TestScopeNames:
    async def test_a_unicode_digit_names_no_scope_and_is_a_404_not_a_500(
        self, urls: tuple[str, str], tracebacks: ErrorRecords
    ) -> None:
        """ "³".isdigit() is true, and int("³") was a ValueError: a 500 on every route naming a scope.

        "٣" (Arabic-Indic) and "３" (full-width) are decimal digits that int() reads: names too.
        """
        admin = f"{urls[1]}/api/v1"
        for method, url, body in (
            ("DELETE", f"{admin}/orgs/%D9%A3", b""),
            ("DELETE", f"{admin}/teams/%EF%BC%93", b""),
            ("PUT", f"{admin}/quotas/project:%D9%A1", b'{"rpm": 5}'),
            ("DELETE", f"{admin}/orgs/%C2%B3", b""),
            ("DELETE", f"{admin}/teams/%C2%B2", b""),
            ("DELETE", f"{admin}/projects/%C2%B9", b""),
            ("PATCH", f"{admin}/orgs/%C2%B3", b'{"name": "x"}'),
            ("PUT", f"{admin}/quotas/org:%C2%B3", b'{"rpm": 5}'),
            ("GET", f"{admin}/teams?org=%C2%B3", b""),
            ("GET", f"{admin}/members?project=%C2%B3", b""),
        ):
            status, reply = await _send(method, url, body, JSON)
            assert status in (400, 404) and isinstance(reply, dict) and reply["error"], (url, reply)

    async def test_a_name_with_a_control_character_is_refused(
        self, urls: tuple[str, str], tracebacks: ErrorRecords
    ) -> None:
        status, reply = await _send("POST", f"{urls[1]}/api/v1/orgs", b'{"name": "a\\u0018b"}', JSON)
        assert status == 400 and "control characters" in str(reply)


# What aiohttp offers a handler to read a body with; each skips a rule of bodies' readers (the
# depth rule, the half-character rule, the admin API's limit, the decoded Content-Encoding).
_RAW_READERS = frozenset({"json", "text", "read", "post", "multipart", "content", "readany", "readexactly"})
_SRC = Path(bodies.__file__).parent
# Not a listener of llmgw's: the sim engine stands in for llama.cpp or vLLM, behind the gateway,
# whose reader has read every request it is sent.
_STAND_INS = frozenset({_SRC / "engines" / "sim_server.py"})


def _request_names(function: ast.AST) -> set[str]:
    """The names a function's parameters give a request: `request`, or any parameter typed as one."""
    names = {"request"}
    if isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef):
        for arg in (*function.args.posonlyargs, *function.args.args, *function.args.kwonlyargs):
            if arg.annotation is not None and ast.unparse(arg.annotation).split(".")[-1] in (
                "Request",
                "BaseRequest",
            ):
                names.add(arg.arg)
    return names


def _raw_reads(source: str) -> list[str]:
    """Where source reads a request's body other than through llmgw.bodies: "line: code"."""
    tree = ast.parse(source)
    found: list[tuple[int, str]] = []
    functions = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)]
    for function in [tree, *functions]:
        names = _request_names(function)
        for node in ast.walk(function):
            if not (isinstance(node, ast.Attribute) and node.attr in _RAW_READERS):
                continue
            owner = node.value
            if (isinstance(owner, ast.Name) and owner.id in names) or (
                isinstance(owner, ast.Attribute) and owner.attr == "request"
            ):
                found.append((node.lineno, ast.unparse(node)))
    return [f"{line}: {code}" for line, code in sorted(set(found))]


class TestTheOneReader:
    def test_no_handler_reads_a_request_body_but_through_llmgw_bodies(self) -> None:
        """The bench route read request.json() itself: JSON nested a thousand deep was a 500 there."""
        found = [
            f"{path.relative_to(_SRC.parent)}:{read}"
            for path in sorted(_SRC.rglob("*.py"))
            if path != Path(bodies.__file__) and path not in _STAND_INS
            for read in _raw_reads(path.read_text(encoding="utf-8"))
        ]
        assert found == [], (
            "read request bodies with llmgw.bodies (read_json, read_fields, read_text, read): "
            "aiohttp's own readers skip its depth, character and size rules\n" + "\n".join(found)
        )

    def test_the_scan_finds_a_handler_that_reads_its_body_itself(self) -> None:
        source = (
            "async def a(request):\n    return await request.json()\n"
            "async def b(r: web.Request):\n    return await r.post()\n"
            "async def c(call):\n    return await call.request.content.read()\n"
            "async def d(reply):\n    return await reply.json()\n"
        )
        assert _raw_reads(source) == ["2: request.json", "4: r.post", "6: call.request.content"]
