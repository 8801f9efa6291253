"""Forwarding a request to its engine and its answer back, byte for byte, as the bytes arrive."""

from __future__ import annotations

from collections.abc import AsyncIterator
from urllib.parse import urlsplit

import aiohttp
import structlog
from aiohttp import hdrs, web
from multidict import istr

from llmgw.gateway.errors import ApiError
from llmgw.gateway.pipeline import Call
from llmgw.gateway.usage import STREAM_TAIL, find_usage

log = structlog.get_logger(__name__)

SESSION_KEY = web.AppKey("llmgw.gateway.session", aiohttp.ClientSession)

# An engine that does not accept a connection within this long is down; one
# that is slow to answer is not (a long prompt may take minutes to prefill).
_CONNECT_TIMEOUT_S = 10.0
# Identity, so that the bytes are JSON and server-sent events that usage
# accounting can read; the client session never decompresses either, so
# whatever an engine sends anyway reaches the client unchanged.
_UPSTREAM_HEADERS = {hdrs.CONTENT_TYPE: "application/json", hdrs.ACCEPT_ENCODING: "identity"}
_COPIED_HEADERS = (hdrs.CONTENT_TYPE, hdrs.CONTENT_ENCODING, hdrs.CONTENT_LENGTH)
# Which catalog model served the call: the one asked for, or a fallback of it.
MODEL_HEADER = istr("x-llmgw-model")


async def client_session(app: web.Application) -> AsyncIterator[None]:
    """cleanup_ctx: the one pooled session every proxied request goes through."""
    connector = aiohttp.TCPConnector(
        # Generous: at high concurrency a request must never queue for a connection.
        limit=4096,
        limit_per_host=0,
        keepalive_timeout=60,
    )
    async with aiohttp.ClientSession(
        connector=connector,
        timeout=aiohttp.ClientTimeout(total=None, sock_connect=_CONNECT_TIMEOUT_S),
        auto_decompress=False,
    ) as session:
        app[SESSION_KEY] = session
        yield


def _did_not_answer(call: Call, exc: BaseException) -> ApiError:
    where = urlsplit(call.endpoint).netloc or call.endpoint
    if isinstance(exc, aiohttp.ClientConnectorError):
        reason = exc.os_error.strerror or str(exc.os_error)
    elif isinstance(exc, aiohttp.ServerDisconnectedError):
        reason = "it closed the connection without replying"
    elif isinstance(exc, TimeoutError):
        reason = f"no connection within {_CONNECT_TIMEOUT_S:g} s"
    else:
        reason = str(exc) or type(exc).__name__
    return ApiError(
        502,
        f"the engine for {call.model} at {where} did not answer: {reason}",
        type="server_error",
        code="engine_unavailable",
    )


async def proxy(call: Call) -> web.StreamResponse:
    """The last stage: send call.body to call.endpoint and stream the answer to the client."""
    session = call.request.app[SESSION_KEY]
    url = call.endpoint + call.request.path_qs
    try:
        upstream = await session.post(url, data=call.body, headers=_UPSTREAM_HEADERS)
    except (aiohttp.ClientError, TimeoutError) as exc:
        raise _did_not_answer(call, exc) from None
    async with upstream:
        headers = {name: upstream.headers[name] for name in _COPIED_HEADERS if name in upstream.headers}
        headers[MODEL_HEADER] = call.served_model or call.model
        try:
            chunk = await upstream.content.readany()
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise _did_not_answer(call, exc) from None
        if upstream.content.at_eof():
            # The whole reply is already here (a non-streamed completion, most
            # often): a plain Response sends headers and body in one write,
            # where a StreamResponse sends its headers on their own first.
            if call.count_usage:
                call.usage = find_usage(chunk)
            return web.Response(body=chunk, status=upstream.status, reason=upstream.reason, headers=headers)
        response = web.StreamResponse(status=upstream.status, reason=upstream.reason, headers=headers)
        # The end of the reply, where the usage is: the bytes go on to the
        # client as they come, only the last few KB are kept.
        tail = bytearray() if call.count_usage else None
        try:
            await response.prepare(call.request)
            while chunk:
                await response.write(chunk)
                if tail is not None:
                    tail += chunk
                    if len(tail) > 2 * STREAM_TAIL:
                        del tail[:-STREAM_TAIL]
                chunk = await upstream.content.readany()
            await response.write_eof()
        except ConnectionResetError:
            # The client went away; leaving the block closes the engine's
            # connection, which tells the engine to stop generating.
            pass
        except (aiohttp.ClientError, TimeoutError) as exc:
            log.warning(
                "the engine stopped answering in the middle of a reply",
                model=call.model,
                endpoint=call.endpoint,
                error=str(exc) or type(exc).__name__,
            )
            # No write_eof: the client must see a cut reply, not a complete one.
            if call.request.transport is not None:
                call.request.transport.close()
        finally:
            if tail is not None:
                call.usage = find_usage(tail)
        return response
