"""The HTTP server of llmgw's listeners: aiohttp's, refusing before any handler in the listener's shape.

aiohttp answers a request it cannot parse (a URL or header past what its parser reads, too many
headers, a request line that is not HTTP) and a handler's unhandled failure itself, before and
outside the app's middlewares, in plain text: a client of the gateway read `400, message: Got
more than 65536 bytes when reading` where it expects OpenAI's error object. ListenerRunner serves
an app as AppRunner does, with each connection answering those in the shape its listener is given.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Any

from aiohttp import web
from aiohttp.http_exceptions import BadHttpMessage, HttpProcessingError, LineTooLong
from aiohttp.web_protocol import RequestHandler

from llmgw import bodies

# The response for a status and a sentence, in the listener's shape (OpenAI's error object on the
# gateway, {"error": "..."} on the admin listener).
Refusal = Callable[[int, str], web.Response]


def _refusal(status: int, exc: BaseException | None) -> tuple[int, str]:
    """The status and sentence for what aiohttp refused with status (exc, its reason, when it gave one)."""
    most = f"at most {bodies.MAX_LINE:,} are taken"
    if isinstance(exc, LineTooLong):
        # The parser reads the request line to one limit and each header to another
        # (bodies.SERVER_OPTIONS): the limit it names says which was too long.
        if exc.args[1:2] == (bodies.MAX_PARSED_LINE,):
            return 414, f"the URL is more than {bodies.MAX_PARSED_LINE:,} bytes; {most}"
        return 431, f"a header is more than {bodies.MAX_PARSED_LINE:,} bytes; {most}"
    if isinstance(exc, BadHttpMessage) and "Too many headers" in exc.message:
        return 431, f"the request has more than {bodies.MAX_HEADERS} headers, the most taken"
    if isinstance(exc, HttpProcessingError):
        # Its first line: aiohttp goes on with the bytes it read and a caret under the one it refused.
        said = bodies.words(exc).splitlines()[0].rstrip(":")
        return status, f"the request could not be read as HTTP: {said}"
    if status == 504:
        return 504, "the server took too long to answer this request"
    if status >= 500:
        return status, "the server failed while answering this request; its log says why"
    return status, "the request could not be read as HTTP"


# How long a connection refused for what could not be read stays open to drain what its client still
# sends (a 1 MiB header, of which the parser read 64 KiB): closed at once, with that unread, the
# system answers the client with a reset, which throws away the refusal before the client reads it.
LINGER_S = 5.0


class _Connection(RequestHandler):
    """aiohttp's connection handler, refusing in the listener's shape."""

    __slots__ = ("_gone", "_refuse", "_unreadable")

    def __init__(self, manager: web.Server, refuse: Refusal, **kwargs: Any) -> None:
        super().__init__(manager, **kwargs)
        self._refuse = refuse
        self._unreadable = False
        self._gone: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def handle_error(
        self,
        request: web.BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        # aiohttp's own logs what it refused (one line, through bodies.SERVER_LOGGER) and gives up
        # on a connection whose reply has begun; only its plain text is not used.
        super().handle_error(request, status, exc, message)
        self._unreadable = isinstance(exc, HttpProcessingError)
        response = self._refuse(*_refusal(status, exc))
        # What follows on the connection cannot be told from a next request.
        response.force_close()
        return response

    async def finish_response(
        self, request: web.BaseRequest, resp: web.StreamResponse, start_time: float | None
    ) -> tuple[web.StreamResponse, bool]:
        finished = await super().finish_response(request, resp, start_time)
        if self._unreadable:
            await self._linger()
        return finished

    async def _linger(self) -> None:
        """The reply sent and this side closed: drop what the client sends till it closes, or LINGER_S."""
        transport = self.transport
        if transport is None or not transport.can_write_eof():
            return
        # From here what arrives is dropped, not parsed (aiohttp's data_received); reading may
        # have paused on a queue of the parser's refusals.
        self.close()
        transport.resume_reading()
        transport.write_eof()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(self._gone), LINGER_S)

    def connection_lost(self, exc: BaseException | None) -> None:
        if not self._gone.done():
            self._gone.set_result(None)
        super().connection_lost(exc)


class _Server(web.Server):
    """The server AppRunner made (made), whose connections are _Connection's."""

    def __init__(self, made: web.Server, refuse: Refusal) -> None:
        # Its options as the app gave them (debug, access log, the parser's limits): aiohttp keeps
        # them only there, and a server built from the runner's own would lose the app's.
        super().__init__(
            made.request_handler,
            request_factory=made.request_factory,
            handler_cancellation=made.handler_cancellation,
            **made._kwargs,
        )
        self._refuse = refuse

    def __call__(self) -> RequestHandler:
        return _Connection(self, self._refuse, loop=self._loop, **self._kwargs)


class ListenerRunner(web.AppRunner):
    """web.AppRunner for a listener whose refusals before any handler are refuse's."""

    def __init__(self, app: web.Application, refuse: Refusal, **kwargs: Any) -> None:
        super().__init__(app, **kwargs)
        self._refuse = refuse

    async def _make_server(self) -> web.Server:
        # AppRunner's server (the app started and frozen, its handler and options), with connections of ours.
        return _Server(await super()._make_server(), self._refuse)
