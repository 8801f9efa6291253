"""Forwarding a request to its engine and its answer back, byte for byte, as the bytes arrive.

The engine is on a node, usually another host: the request carries the
replica's secret in place of whatever Authorization the client sent (the
client's llmgw key never leaves the gateway). A request whose node is
declared unreachable while it is in flight is abandoned with a 502 naming the
node, rather than left waiting on a connection a dead host will never close;
an engine that does not accept the connection leaves the routing table.
"""

from __future__ import annotations

import asyncio
import errno
import socket
import time
from collections.abc import AsyncIterator, Callable
from urllib.parse import urlsplit

import aiohttp
import structlog
from aiohappyeyeballs import AddrInfoType
from aiohttp import hdrs, web
from multidict import istr

from llmgw.gateway.errors import ApiError
from llmgw.gateway.pipeline import Call
from llmgw.gateway.streams import StreamTap
from llmgw.gateway.usage import STREAM_TAIL, find_usage

log = structlog.get_logger(__name__)

SESSION_KEY = web.AppKey("llmgw.gateway.session", aiohttp.ClientSession)

# An engine that does not accept a connection within this long is down; one
# that is slow to answer is not (a long prompt may take minutes to prefill).
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
# Which catalog model served the call: the one asked for, or a fallback of it.
MODEL_HEADER = istr("x-llmgw-model")
REQUEST_ID_HEADER = istr("x-request-id")
# The gateway's series (gateway/metrics.py), for the engines that fail to answer.
UpstreamErrors = Callable[[str, str], None]
UPSTREAM_ERRORS_KEY: web.AppKey[UpstreamErrors] = web.AppKey("llmgw.gateway.upstream_errors")


class EngineRefused(ApiError):
    """The engine did not take the connection: nothing of the request reached it, so another replica may."""


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
    where = urlsplit(call.endpoint).netloc or call.endpoint
    return f"{where} on node {call.route.node_id}" if call.route is not None else where


def _did_not_answer(call: Call, exc: BaseException) -> ApiError:
    where = _where(call)
    if isinstance(exc, aiohttp.ClientConnectorError):
        reason = exc.os_error.strerror or str(exc.os_error)
    elif isinstance(exc, aiohttp.ServerDisconnectedError):
        reason = "it closed the connection without replying"
    elif isinstance(exc, TimeoutError):
        reason = f"no connection within {_CONNECT_TIMEOUT_S:g} s"
    elif _unacknowledged(exc):
        reason = f"it acknowledged nothing of the request for {_UNACKNOWLEDGED_S:g} s"
    else:
        reason = str(exc) or type(exc).__name__
    kind = EngineRefused if isinstance(exc, (aiohttp.ClientConnectorError, TimeoutError)) else ApiError
    return kind(
        502,
        f"the engine for {call.model} at {where} did not answer: {reason}",
        type="server_error",
        code="engine_unavailable",
    )


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

    # Like asyncio.timeout: the node's loss cancels this task, and only that cancel becomes a 502.
    started: list[web.StreamResponse] = []
    route.lost.add_done_callback(abandon)
    try:
        return await _forward(call, started)
    except asyncio.CancelledError:
        if not route.lost.done() or task.uncancel() > 0:
            raise
        reason = route.lost.result()
        log.warning(
            "abandoned a request to a node that became unreachable",
            model=call.model,
            endpoint=call.endpoint,
            node=route.node_id,
        )
        if started:
            # The client already has part of the reply; it sees it cut, not complete.
            return started[0]
        raise ApiError(
            502,
            f"the engine for {call.model} at {_where(call)} was abandoned mid-request: {reason}",
            type="server_error",
            code="engine_unavailable",
        ) from None
    finally:
        done = True
        route.lost.remove_done_callback(abandon)


def _headers(call: Call) -> dict[istr, str]:
    # Built fresh: the client's own Authorization (its llmgw key) is never among them.
    if call.route is None or not call.route.secret:
        return _UPSTREAM_HEADERS
    return {**_UPSTREAM_HEADERS, hdrs.AUTHORIZATION: f"Bearer {call.route.secret}"}


async def _forward(call: Call, started: list[web.StreamResponse]) -> web.StreamResponse:
    """Send the request, stream the reply; started gets the client's response once it is under way."""
    upstream = await _send(call)
    async with upstream:
        tap = _tap(call, upstream)
        headers = _reply_headers(call, upstream, tap)
        chunk = await _first_read(call, upstream)
        if upstream.content.at_eof():
            return _whole_reply(call, upstream, chunk, tap, headers)
        return await _stream_reply(call, upstream, chunk, tap, headers, started)


async def _send(call: Call) -> aiohttp.ClientResponse:
    """The request sent to the engine, and its reply's status and headers; a 502 when it did not answer."""
    session = call.request.app[SESSION_KEY]
    url = call.endpoint + call.request.path_qs
    try:
        return await session.post(url, data=call.body, headers=_headers(call))
    except (aiohttp.ClientError, TimeoutError) as exc:
        _count_upstream_error(call, "connect")
        error = _did_not_answer(call, exc)
        if call.route is not None and (isinstance(error, EngineRefused) or _unacknowledged(exc)):
            # It did not take the connection, or the request: a dead engine, a node whose agent is
            # down and whose engines went with it, a cut link. Nothing more goes there until its
            # agent says it is ready.
            call.route.refused(error.message)
        raise error from None


def _tap(call: Call, upstream: aiohttp.ClientResponse) -> StreamTap | None:
    """What reads the usage out of a stream of events as it passes, when the call's usage is counted."""
    events = upstream.headers.get(hdrs.CONTENT_TYPE, "").startswith("text/event-stream")
    return StreamTap(call.hide_usage) if call.count_usage and events else None


def _reply_headers(call: Call, upstream: aiohttp.ClientResponse, tap: StreamTap | None) -> dict[istr, str]:
    headers = {name: upstream.headers[name] for name in _COPIED_HEADERS if name in upstream.headers}
    headers[MODEL_HEADER] = call.served_model or call.model
    if call.request_id:
        headers[REQUEST_ID_HEADER] = call.request_id
    if tap is not None and call.hide_usage:
        # Its length is the engine's, with the chunk the client did not ask for.
        headers.pop(hdrs.CONTENT_LENGTH, None)
    return headers


async def _first_read(call: Call, upstream: aiohttp.ClientResponse) -> bytes:
    """The reply's first bytes (call.first_byte says when); a 502 when the engine sends none."""
    try:
        chunk = await upstream.content.readany()
    except (aiohttp.ClientError, TimeoutError) as exc:
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
    if tap is not None and call.hide_usage:
        chunk = tap.feed(chunk) + tap.end()
        call.usage = tap.usage
    elif call.count_usage:
        # Nothing to hide or hold back (the response goes out only after done()): the usage
        # is all a stream's tap would find, and finding it costs half as much.
        call.usage = find_usage(chunk)
    if call.done is not None:
        # Before the response exists: aiohttp sends it only once this handler has returned.
        call.done(upstream.status)
    return web.Response(body=chunk, status=upstream.status, reason=upstream.reason, headers=headers)


async def _stream_reply(
    call: Call,
    upstream: aiohttp.ClientResponse,
    chunk: bytes,
    tap: StreamTap | None,
    headers: dict[istr, str],
    started: list[web.StreamResponse],
) -> web.StreamResponse:
    """A reply still arriving, written to the client as it comes; cut, never made whole, when an end goes."""
    response = web.StreamResponse(status=upstream.status, reason=upstream.reason, headers=headers)
    try:
        started.append(response)
        await response.prepare(call.request)
        await _relay(call, upstream, chunk, tap, response)
    except ConnectionResetError:
        # The client went away; leaving the block closes the engine's
        # connection, which tells the engine to stop generating.
        pass
    except (aiohttp.ClientError, TimeoutError) as exc:
        _count_upstream_error(call, "reply")
        log.warning(
            "the engine stopped answering in the middle of a reply",
            model=call.model,
            endpoint=call.endpoint,
            error=str(exc) or type(exc).__name__,
        )
        # No write_eof: the client must see a cut reply, not a complete one.
        if call.request.transport is not None:
            call.request.transport.close()
    except asyncio.CancelledError:
        # Abandoned (its node was lost) or the server is stopping: cut, never made to look whole.
        if call.request.transport is not None:
            call.request.transport.close()
        raise
    finally:
        if call.usage is None:
            # Cut short: the last usage the engine reported on the way, if it reports any mid-stream.
            call.usage = tap.usage if tap is not None else None
    return response


async def _relay(
    call: Call,
    upstream: aiohttp.ClientResponse,
    chunk: bytes,
    tap: StreamTap | None,
    response: web.StreamResponse,
) -> None:
    """Every chunk from the engine to the client, the usage found on the way, then the reply's end."""
    # A reply that is not a stream of events (a long non-streamed one) goes one read behind, so that
    # its last bytes wait for its usage to be journaled; only its last few KB are kept to find it in.
    tail = bytearray() if call.count_usage and tap is None else None
    behind = b""
    while chunk:
        if tap is not None:
            if ready := tap.feed(chunk):
                await response.write(ready)
        elif tail is not None:
            if behind:
                await response.write(behind)
            behind = chunk
            tail += chunk
            if len(tail) > 2 * STREAM_TAIL:
                del tail[:-STREAM_TAIL]
        else:
            await response.write(chunk)
        chunk = await upstream.content.readany()
    if tap is not None:
        behind = tap.end()
        call.usage = tap.usage
    elif tail is not None:
        call.usage = find_usage(tail)
    if call.done is not None:
        call.done(upstream.status)
    if behind:
        await response.write(behind)
    await response.write_eof()
