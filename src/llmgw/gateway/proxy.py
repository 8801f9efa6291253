"""Forwarding a request to its engine and its answer back, byte for byte, as the bytes arrive.

The engine is on a node, usually another host: the request carries the
replica's secret in place of whatever Authorization the client sent (the
client's llmgw key never leaves the gateway). A request whose node is
declared unreachable while it is in flight is abandoned with a 502 naming the
node, rather than left waiting on a connection a dead host will never close;
an engine that does not accept the connection leaves the routing table.

Each read from the engine is bounded by the model's `timeouts` (deadlines.py);
what an engine sends that no client could use (a 5xx page, a reply that is not
JSON, a stream that is not events of JSON) becomes an error in OpenAI's shape
(faults.py). Before the first byte reaches the client, a failure is an
EngineFailed the router may send to another replica; after, a stream ends with
an error event.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import socket
import time
from collections.abc import AsyncIterator, Callable
from urllib.parse import urlsplit

import aiohttp
import structlog
from aiohappyeyeballs import AddrInfoType
from aiohttp import hdrs, web
from multidict import istr

from llmgw.gateway.apis import CHAT
from llmgw.gateway.deadlines import Deadlines, EngineTimedOut
from llmgw.gateway.errors import ApiError, in_shape
from llmgw.gateway.faults import (
    EXCERPT,
    EngineFailed,
    EngineRefused,
    KeyStrike,
    ends_like_json,
    key_strike,
    looks_like_json,
    not_json,
    scrub,
    server_error,
    stream_failed,
    where,
)
from llmgw.gateway.pipeline import Call
from llmgw.gateway.streams import MalformedStream, StreamTap
from llmgw.gateway.translation import CHAT_PATH, TRANSLATED, Translation
from llmgw.gateway.upstream import REFUSAL_BODY, is_endpoint, refusal, url_of
from llmgw.gateway.usage import STREAM_TAIL, find_usage
from llmgw.translate.chat import TranslationError

log = structlog.get_logger(__name__)

SESSION_KEY = web.AppKey("llmgw.gateway.session", aiohttp.ClientSession)

# The session's own bound on a connection; each request brings its model's `timeouts.connect_s`.
_CONNECT_TIMEOUT_S = 10.0
# A request written to an engine whose node's link is gone is never acknowledged,
# and the kernel would retransmit it for some fifteen minutes while the client
# waits. Only unacknowledged data counts: a long prefill or a slow stream leaves
# the gateway nothing unacknowledged, so neither is cut by this.
_UNACKNOWLEDGED_S = 5.0
# Identity, so that the bytes are JSON and server-sent events that usage
# accounting can read; the client session never decompresses either, so
# whatever an engine sends anyway reaches the client unchanged.
_UPSTREAM_HEADERS = {hdrs.CONTENT_TYPE: "application/json", hdrs.ACCEPT_ENCODING: "identity"}
_COPIED_HEADERS = (hdrs.CONTENT_TYPE, hdrs.CONTENT_ENCODING, hdrs.CONTENT_LENGTH)
_ANTHROPIC_HEADERS = (istr("anthropic-version"), istr("anthropic-beta"))
# Which catalog model served the call: the one asked for, or a fallback of it.
MODEL_HEADER = istr("x-llmgw-model")
# Which replica served the call (its id; the engine's address without a control plane): after a retry,
# the one that answered.
REPLICA_HEADER = istr("x-llmgw-replica")
# How much of an engine's 5xx reply is read to say what went wrong.
_ERROR_BODY = 8 * EXCERPT
REQUEST_ID_HEADER = istr("x-request-id")
# The gateway's series (gateway/metrics.py), for the engines that fail to answer.
UpstreamErrors = Callable[[str, str], None]
UPSTREAM_ERRORS_KEY: web.AppKey[UpstreamErrors] = web.AppKey("llmgw.gateway.upstream_errors")

__all__ = ["EngineFailed", "EngineRefused", "proxy"]


def _upstream_socket(addr_info: AddrInfoType) -> socket.socket:
    family, type_, proto, _, _ = addr_info
    sock = socket.socket(family=family, type=type_, proto=proto)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, int(_UNACKNOWLEDGED_S * 1000))
    return sock


async def client_session(app: web.Application) -> AsyncIterator[None]:
    """cleanup_ctx: the one pooled session every proxied request goes through."""
    connector = aiohttp.TCPConnector(
        # Generous: at high concurrency a request must never queue for a connection.
        limit=4096,
        limit_per_host=0,
        keepalive_timeout=60,
        socket_factory=_upstream_socket,
    )
    async with aiohttp.ClientSession(
        connector=connector,
        timeout=aiohttp.ClientTimeout(total=None, sock_connect=_CONNECT_TIMEOUT_S),
        auto_decompress=False,
    ) as session:
        app[SESSION_KEY] = session
        yield


def _count_upstream_error(call: Call, stage: str) -> None:
    count = call.request.config_dict.get(UPSTREAM_ERRORS_KEY)
    if count is not None:
        count(call.route.node_id if call.route is not None else "", stage)


def _where(call: Call) -> str:
    if is_endpoint(call):
        return where(call)
    at = urlsplit(call.endpoint).netloc or call.endpoint
    return f"{at} on node {call.route.node_id}" if call.route is not None else at


def _did_not_answer(call: Call, exc: BaseException, dropped: bool = False) -> ApiError:
    """The error for an engine that gave no reply; dropped: it had closed a connection the request was on."""
    at = _where(call)
    if isinstance(exc, aiohttp.ClientConnectorError) and exc.os_error.errno == errno.ECONNREFUSED:
        # asyncio's words are "Connect call failed ('127.0.0.1', 20026)", which read as if the request
        # had never reached the engine: after a dropped connection, it had, and the engine then died.
        reason = (
            "it closed the connection without replying, and then refused a new one (it is gone)"
            if dropped
            else "nothing listens on its port (connection refused)"
        )
    elif isinstance(exc, aiohttp.ClientConnectorError):
        reason = exc.os_error.strerror or str(exc.os_error)
    elif isinstance(exc, aiohttp.ServerDisconnectedError):
        reason = "it closed the connection without replying"
    elif isinstance(exc, TimeoutError):
        reason = f"no connection within {call.timeouts.connect_s:g} s (timeouts.connect_s)"
    elif _unacknowledged(exc):
        reason = f"it acknowledged nothing of the request for {_UNACKNOWLEDGED_S:g} s"
    elif isinstance(exc, aiohttp.ClientPayloadError):
        # aiohttp's words ("Response payload is not completed: <TransferEncodingError ...>") go to the log.
        log.warning("the engine cut its reply short", endpoint=call.endpoint, error=str(exc))
        reason = "it closed the connection before its reply was complete"
    else:
        reason = str(exc) or type(exc).__name__
    # A connection reset or closed before the reply's first byte: nothing reached the client either.
    kind = EngineRefused if isinstance(exc, (aiohttp.ClientConnectorError, TimeoutError)) else EngineFailed
    return kind(
        502,
        f"the {'server' if is_endpoint(call) else 'engine'} for {call.model} at {at} "
        f"did not answer: {reason}",
        type="server_error",
        code="engine_unavailable",
    )


# How many kept-alive connections a request may find closed by the engine before one answers: the
# pool holds at most a few per engine, each given up once it fails.
_STALE_CONNECTIONS = 3


def _unacknowledged(exc: BaseException) -> bool:
    """Whether exc is the kernel giving up on a request its engine never acknowledged (a lost link)."""
    cause = exc if isinstance(exc, OSError) else exc.__cause__ or exc.__context__
    return isinstance(cause, OSError) and cause.errno == errno.ETIMEDOUT


async def proxy(call: Call) -> web.StreamResponse:
    """The last stage: send call.body to call.endpoint and stream the answer to the client."""
    route = call.route
    if route is None:
        return await _forward(call, [])
    task = asyncio.current_task()
    assert task is not None
    done = False

    def abandon(_: object) -> None:
        # A future runs its callbacks soon after, not at, its result: by then the request may be over,
        # and cancelling the task would cut the next thing it does.
        if not done:
            task.cancel()

    # Like asyncio.timeout: the replica's loss cancels this task, and only that cancel becomes an error.
    started: list[web.StreamResponse] = []
    route.lost.add_done_callback(abandon)
    try:
        return await _forward(call, started)
    except asyncio.CancelledError:
        if not route.lost.done() or task.uncancel() > 0:
            raise
        reason = route.lost.result()
        log.warning(
            "abandoned a request to a replica given up for lost",
            model=call.model,
            endpoint=call.endpoint,
            node=route.node_id,
            reason=reason,
            request_id=call.request_id,
        )
        if started:
            # The client already has part of the reply, and an error event saying why it ends there
            # (_stream_reply); it sees it cut, not complete.
            return started[0]
        # Nothing of the reply reached the client: another ready replica may take the request (router.py).
        raise EngineFailed(
            502,
            f"the engine for {call.model} at {_where(call)} was abandoned mid-request: {reason}",
            type="server_error",
            code="engine_unavailable",
        ) from None
    finally:
        done = True
        route.lost.remove_done_callback(abandon)


def _headers(call: Call) -> dict[istr, str]:
    # Built fresh: the client's own Authorization or x-api-key (its llmgw key) is never among them.
    headers = _UPSTREAM_HEADERS
    sent = call.request.headers
    if call.api.body == "multipart":
        # The form's boundary is in its Content-Type.
        headers = {**headers, hdrs.CONTENT_TYPE: sent.get(hdrs.CONTENT_TYPE, "")}
    if call.api.errors == "anthropic":
        # Which version and betas of the Messages API the client speaks, for an engine that reads them.
        passed = {name: sent[name] for name in _ANTHROPIC_HEADERS if name in sent}
        if passed:
            headers = {**headers, **passed}
    if call.route is None or not call.route.secret:
        return headers
    return {**headers, hdrs.AUTHORIZATION: f"Bearer {call.route.secret}"}


async def _forward(call: Call, started: list[web.StreamResponse]) -> web.StreamResponse:
    """Send the request, stream the reply; started gets the client's response once it is under way."""
    deadlines = Deadlines(call.timeouts)
    # Per try: a fallback's engine may speak the API its first choice did not.
    call.translation = translated = _translation(call)
    call.upstream_path = CHAT_PATH if translated is not None else ""
    if translated is not None:
        call.body = translated.body
    # One deadline for the status line and the first bytes: a stalled engine sends neither.
    first = deadlines.first_byte()
    upstream = await _send(call, deadlines, first)
    async with upstream:
        if upstream.status >= 500:
            raise await _server_error(call, upstream, deadlines, first)
        if upstream.status >= 400 and (is_endpoint(call) or call.api.errors != "openai"):
            return await _refused(call, upstream, deadlines, first)
        tap = _tap(call, upstream)
        headers = _reply_headers(call, upstream, tap)
        chunk = await _first_read(call, upstream, deadlines, first)
        if (
            tap is None
            and call.api.replies_json
            and 200 <= upstream.status < 300
            and not looks_like_json(chunk)
        ):
            _count_upstream_error(call, "reply")
            raise not_json(call, upstream.status, upstream.headers.get(hdrs.CONTENT_TYPE, ""), chunk)
        if translated is not None and tap is None and not upstream.content.at_eof():
            # A chat completion is said back whole: it is read whole first.
            chunk += await _rest(call, upstream, deadlines)
        if upstream.content.at_eof():
            return _whole_reply(call, upstream, chunk, tap, headers)
        return await _stream_reply(call, upstream, chunk, tap, headers, deadlines, started)


async def _send(call: Call, deadlines: Deadlines, first: tuple[float, str]) -> aiohttp.ClientResponse:
    """The request sent, its reply's status and headers; a 502 or 504 when it did not answer."""
    session = call.request.app[SESSION_KEY]
    url = url_of(call)
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=call.timeouts.connect_s)
    dropped = False
    try:
        async with asyncio.timeout_at(first[0]):
            for _ in range(_STALE_CONNECTIONS):
                try:
                    return await session.post(url, data=call.body, headers=_headers(call), timeout=timeout)
                except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError) as exc:
                    if isinstance(exc, aiohttp.ClientConnectorError) or _unacknowledged(exc):
                        raise  # no connection at all, or a lost link: not a stale connection
                    # A kept-alive connection the engine had already closed: llama-server announces
                    # Keep-Alive on a streamed reply, then closes, and about one request in ten met such
                    # a connection with a 502 ("it closed the connection without replying", or "can not
                    # write request body" when the close came first). Nothing was read, and the dead
                    # connection has left the pool: the next try takes another, or a fresh one.
                    dropped = True
                    continue
            return await session.post(url, data=call.body, headers=_headers(call), timeout=timeout)
    except aiohttp.ClientError as exc:
        failure: BaseException = exc
    except TimeoutError:
        raise _stalled(call, deadlines.expired(call, first[1])) from None
    _count_upstream_error(call, "connect")
    error = _did_not_answer(call, failure, dropped)
    if call.route is not None and (isinstance(error, EngineRefused) or _unacknowledged(failure)):
        # It did not take the connection, or the request: a dead engine, a node whose agent is
        # down and whose engines went with it, a cut link. Nothing more goes there until its
        # agent says it is ready.
        call.route.refused(error.message)
    raise error from None


def _translation(call: Call) -> Translation | None:
    """The call's translation when its route's engine lacks its API; None to send it as it came.

    A route that does not say what its engine speaks (a gateway without a control plane, a table an
    older leader published) is sent the API as it came.
    """
    route = call.route
    name = call.api.name
    if route is None or route.native_apis is None or name not in TRANSLATED or name in route.native_apis:
        return None
    try:
        payload = json.loads(call.body)
    except ValueError:
        payload = call.payload
    try:
        return Translation(name, payload, call.model)
    except TranslationError as exc:
        served = call.served_model or call.model
        raise ApiError(
            400,
            f"{exc.message} ({served}'s engine does not serve {call.api.paths[0]} itself, and the gateway "
            "says the request as chat completions)",
            param=exc.param,
            code="untranslatable",
        ) from None


def _stalled(call: Call, error: EngineTimedOut) -> EngineTimedOut:
    """error, once the engine that took too long has left the routing table."""
    _count_upstream_error(call, "timeout")
    log.warning(
        "the engine sent nothing within its model's timeout",
        model=call.served_model or call.model,
        endpoint=call.endpoint,
        node=call.route.node_id if call.route is not None else None,
        timeout=f"timeouts.{error.key}",
        request_id=call.request_id,
    )
    if call.route is not None:
        # A stopped or wedged engine still accepts connections (the kernel does): only the gateway,
        # waiting on it, can tell. Nothing more goes there until its agent says it is ready again.
        call.route.refused(error.message)
    return error


async def _server_error(
    call: Call, upstream: aiohttp.ClientResponse, deadlines: Deadlines, first: tuple[float, str]
) -> EngineFailed:
    """The error for an engine's 5xx, from the start of what it sent (bounded: an error page can be long)."""
    _count_upstream_error(call, "status")
    body = await _start_of(call, upstream, deadlines, first, _ERROR_BODY)
    return await server_error(call, upstream.status, upstream.headers.get(hdrs.CONTENT_TYPE, ""), body)


async def _refused(
    call: Call, upstream: aiohttp.ClientResponse, deadlines: Deadlines, first: tuple[float, str]
) -> web.Response:
    """An endpoint's 4xx: an error naming it (upstream.py), or the client's own passed on, without the key.

    On a route whose errors are not OpenAI's (the Messages API), a replica's 4xx too: llama-server
    refuses a Messages request with OpenAI's error object, which Anthropic's clients cannot read.
    """
    body = await _start_of(call, upstream, deadlines, first, REFUSAL_BODY)
    error = refusal(call, upstream.status, upstream.headers, body) if is_endpoint(call) else None
    if error is not None:
        _count_upstream_error(call, "status")
        raise error
    body = in_shape(call.api.errors, upstream.status, body)
    headers = {name: upstream.headers[name] for name in (hdrs.CONTENT_TYPE,) if name in upstream.headers}
    headers[MODEL_HEADER] = call.served_model or call.model
    if call.request_id:
        headers[REQUEST_ID_HEADER] = call.request_id
    if call.done is not None:
        call.done(upstream.status)
    return web.Response(
        body=scrub(call, body), status=upstream.status, reason=upstream.reason, headers=headers
    )


async def _rest(call: Call, upstream: aiohttp.ClientResponse, deadlines: Deadlines) -> bytes:
    """The rest of a reply, each read bounded by the model's timeouts."""
    body = bytearray()
    try:
        while chunk := await deadlines.read(call, upstream, deadlines.next_byte()):
            body += chunk
    except EngineTimedOut as exc:
        raise _stalled(call, exc) from None
    except aiohttp.ClientError as exc:
        _count_upstream_error(call, "reply")
        raise _did_not_answer(call, exc) from None
    return bytes(body)


async def _start_of(
    call: Call, upstream: aiohttp.ClientResponse, deadlines: Deadlines, first: tuple[float, str], limit: int
) -> bytes:
    """Up to limit bytes of a reply, or what came of it before the engine stopped sending."""
    body = bytearray()
    deadline = first
    try:
        while len(body) < limit and (chunk := await deadlines.read(call, upstream, deadline)):
            body += chunk
            deadline = deadlines.next_byte()
    except (aiohttp.ClientError, EngineTimedOut):
        pass  # what it sent before it stopped says enough
    return bytes(body)


def _tap(call: Call, upstream: aiohttp.ClientResponse) -> StreamTap | None:
    """What checks a stream of events and reads its usage as it passes (a translated one's as chat's)."""
    events = upstream.headers.get(hdrs.CONTENT_TYPE, "").startswith("text/event-stream")
    if not events:
        return None
    return StreamTap(call.hide_usage, CHAT.stream if call.translation is not None else call.api.stream)


def _reply_headers(call: Call, upstream: aiohttp.ClientResponse, tap: StreamTap | None) -> dict[istr, str]:
    headers = {name: upstream.headers[name] for name in _COPIED_HEADERS if name in upstream.headers}
    headers[MODEL_HEADER] = call.served_model or call.model
    headers[REPLICA_HEADER] = call.route.shard_id if call.route is not None else _where(call)
    if call.request_id:
        headers[REQUEST_ID_HEADER] = call.request_id
    if tap is not None or call.translation is not None or (call.route is not None and call.route.secret):
        # Its length is the engine's, with the chunk the client did not ask for or an error event, or
        # of the reply before it was translated, or with the endpoint's key it quoted.
        headers.pop(hdrs.CONTENT_LENGTH, None)
    return headers


async def _first_read(
    call: Call, upstream: aiohttp.ClientResponse, deadlines: Deadlines, first: tuple[float, str]
) -> bytes:
    """The reply's first bytes (call.first_byte says when); a 502 or 504 when the engine sends none."""
    try:
        chunk = await deadlines.read(call, upstream, first)
    except EngineTimedOut as exc:
        raise _stalled(call, exc) from None
    except aiohttp.ClientError as exc:
        _count_upstream_error(call, "reply")
        raise _did_not_answer(call, exc) from None
    call.first_byte = time.perf_counter()
    return chunk


def _whole_reply(
    call: Call,
    upstream: aiohttp.ClientResponse,
    chunk: bytes,
    tap: StreamTap | None,
    headers: dict[istr, str],
) -> web.Response:
    """A reply already all here (a non-streamed completion, most often), sent in one write.

    A plain Response sends headers and body in one write, where a StreamResponse sends its
    headers on their own first.
    """
    content_type = upstream.headers.get(hdrs.CONTENT_TYPE, "")
    translated = call.translation
    if tap is not None:
        try:
            chunk = tap.feed(chunk) + tap.end()
        except MalformedStream as exc:
            _count_upstream_error(call, "reply")
            raise not_json(call, upstream.status, content_type, exc.event) from None
        call.usage = tap.usage
        if translated is not None:
            chunk = translated.events(chunk) + translated.finish()
            call.usage = translated.usage or tap.usage
    else:
        if call.api.replies_json and 200 <= upstream.status < 300 and not ends_like_json(chunk):
            _count_upstream_error(call, "reply")
            raise not_json(call, upstream.status, content_type, chunk)
        if call.count_usage:
            call.usage = find_usage(chunk)
        if translated is not None and 200 <= upstream.status < 300:
            chunk = translated.reply(chunk)
    if call.done is not None:
        # Before the response exists: aiohttp sends it only once this handler has returned.
        call.done(upstream.status)
    # An endpoint may quote its key in a 200 as in an error (an echo of the request, a debug field).
    return web.Response(
        body=scrub(call, chunk), status=upstream.status, reason=upstream.reason, headers=headers
    )


async def _stream_reply(
    call: Call,
    upstream: aiohttp.ClientResponse,
    chunk: bytes,
    tap: StreamTap | None,
    headers: dict[istr, str],
    deadlines: Deadlines,
    started: list[web.StreamResponse],
) -> web.StreamResponse:
    """A reply still arriving, written to the client as it comes; never made whole when the engine fails."""
    response = web.StreamResponse(status=upstream.status, reason=upstream.reason, headers=headers)
    try:
        started.append(response)
        await response.prepare(call.request)
        await _relay(call, upstream, chunk, tap, response, deadlines)
    except ConnectionResetError:
        # The client went away; leaving the block closes the engine's
        # connection, which tells the engine to stop generating. It pays for what it was sent.
        _delivered(call, tap)
    except (aiohttp.ClientError, EngineTimedOut, MalformedStream, _NotWhole) as exc:
        await _broken(call, exc, tap, response)
    except asyncio.CancelledError:
        lost = call.route.lost if call.route is not None else None
        if lost is not None and lost.done():
            # Given up for lost (its node unreachable, its engine stalled): the client hears why.
            await _end(call, _abandoned(call, lost.result(), tap), tap, response)
        else:
            # The server is stopping, or its client left where the server cancels handlers: cut,
            # never made to look whole, and charged what it was sent.
            _delivered(call, tap)
            if call.request.transport is not None:
                call.request.transport.close()
        raise
    finally:
        if call.usage is None:
            # Cut short: the last usage the engine reported on the way, if it reports any mid-stream.
            call.usage = tap.usage if tap is not None else None
    return response


class _NotWhole(Exception):
    """A reply that is not a stream of events ended where no JSON does (`tail` holds its end)."""

    def __init__(self, tail: bytes) -> None:
        super().__init__("its reply ended in the middle")
        self.tail = tail


async def _broken(call: Call, exc: Exception, tap: StreamTap | None, response: web.StreamResponse) -> None:
    """End a reply under way that the engine broke: an error event, then a cut, never a whole-looking end."""
    _count_upstream_error(call, "reply")
    if isinstance(exc, EngineTimedOut):
        error: ApiError = _stalled(call, exc)
    elif isinstance(exc, MalformedStream):
        error = stream_failed(call, "it sent an event that is not JSON", exc.event)
    elif isinstance(exc, _NotWhole):
        error = stream_failed(call, "its reply ended in the middle", exc.tail)
    else:
        error = _cut(call, exc, tap)
    passed = exc.passed if isinstance(exc, MalformedStream) else b""
    await _end(call, error, tap, response, passed)


async def _end(
    call: Call, error: ApiError, tap: StreamTap | None, response: web.StreamResponse, passed: bytes = b""
) -> None:
    """End a reply under way with error: passed (whole events still the client's), an error event, a cut.

    The event, for a client reading events (OpenAI's raise it as an APIError); the cut, for one reading
    bytes, so that neither takes half a reply for a whole one.
    """
    if tap is not None:
        translated = call.translation
        if passed:
            passed = translated.events(passed) if translated is not None else passed
            passed = scrub(call, passed)
            with contextlib.suppress(ConnectionResetError):
                await response.write(passed)
        _delivered(call, tap)
        event = (
            translated.error_event(error) if translated is not None else call.api.stream.error_event(error)
        )
        with contextlib.suppress(ConnectionResetError):
            await response.write(event)
    if call.request.transport is not None:
        call.request.transport.close()


def _delivered(call: Call, tap: StreamTap | None) -> None:
    """Note what the client had of a stream cut short: admission charges for it (and for no less),
    not for the reservation it never received."""
    if tap is not None:
        call.delivered = tap.events
        call.delivered_prompt = tap.prompt


def _tokens(tap: StreamTap | None) -> str:
    """What of a stream the client had, in words: a token for each event of generated text."""
    if tap is None:
        return ""
    return f"{tap.events} token{'' if tap.events == 1 else 's'}"


def _abandoned(call: Call, reason: str, tap: StreamTap | None) -> ApiError:
    """The error that ends a stream whose replica was given up for lost while it ran."""
    delivered = _tokens(tap)
    return ApiError(
        502,
        f"{call.served_model or call.model} on {where(call)} was abandoned mid-reply: {reason}"
        + (f"; {delivered} had been delivered" if delivered else ""),
        type="server_error",
        code="engine_unavailable",
    )


def _cut(call: Call, exc: BaseException, tap: StreamTap | None) -> ApiError:
    """The error for a connection to the engine that failed mid-reply, in words; the library's in the log.

    The client once read "the connection failed (Response payload is not completed:
    <TransferEncodingError: 400, ...>)": aiohttp's account of the engine's end, not the engine's.
    """
    if _unacknowledged(exc):
        what = f"acknowledged nothing the gateway sent for {_UNACKNOWLEDGED_S:g} s"
    elif isinstance(exc, aiohttp.ClientOSError) and exc.errno == errno.ECONNRESET:
        what = "reset the connection"
    else:
        what = "closed the connection"
    delivered = _tokens(tap)
    log.warning(
        "the engine broke a stream under way",
        model=call.served_model or call.model,
        node=call.route.node_id if call.route is not None else None,
        endpoint=call.endpoint,
        what=what,
        error=str(exc) or type(exc).__name__,
        request_id=call.request_id,
    )
    return ApiError(
        502,
        f"the {'server' if is_endpoint(call) else 'engine'} for {call.served_model or call.model} on "
        f"{where(call)} {what} mid-reply" + (f" after {delivered}" if delivered else ""),
        type="server_error",
        code="engine_error",
    )


def _struck(strike: KeyStrike | None, last: bytes, *, fed: bool = False) -> bytes:
    """The reply's last bytes with what strike held, struck of the key; fed: strike has seen them."""
    if strike is None:
        return last
    return (last if fed else strike.feed(last)) + strike.end()


async def _relay(
    call: Call,
    upstream: aiohttp.ClientResponse,
    chunk: bytes,
    tap: StreamTap | None,
    response: web.StreamResponse,
    deadlines: Deadlines,
) -> None:
    """Every chunk from the engine to the client, the usage found on the way, then the reply's end."""
    # A reply that is not a stream of events (a long non-streamed one) goes one read behind, so that
    # its last bytes wait for its usage to be journaled and for a look at how it ends; only its last
    # few KB are kept to find the usage in.
    tail = bytearray() if call.count_usage and tap is None else None
    behind = b""
    translated = call.translation
    # An endpoint's key struck out of what the client gets, as out of its errors.
    strike = key_strike(call)
    while chunk:
        if tap is not None:
            ready = tap.feed(chunk)
            if translated is not None and ready:
                ready = translated.events(ready)
            if ready and strike is not None:
                ready = strike.feed(ready)
            if ready:
                await response.write(ready)
        else:
            if behind:
                await response.write(behind)
            behind = strike.feed(chunk) if strike is not None else chunk
            if tail is not None:
                tail += chunk
                if len(tail) > 2 * STREAM_TAIL:
                    del tail[:-STREAM_TAIL]
        chunk = await deadlines.read(call, upstream, deadlines.next_byte())
    if tap is not None:
        behind = tap.end()
        call.usage = tap.usage
        if translated is not None:
            behind = translated.events(behind) + translated.finish()
            call.usage = translated.usage or tap.usage
        behind = _struck(strike, behind)
    else:
        behind = _struck(strike, behind, fed=True)
        if call.api.replies_json and 200 <= upstream.status < 300 and not ends_like_json(behind):
            raise _NotWhole(behind[-EXCERPT:])
        if tail is not None:
            call.usage = find_usage(tail)
    if call.done is not None:
        call.done(upstream.status)
    if behind:
        await response.write(behind)
    await response.write_eof()
