"""Request bodies that are not what they say, answered in the words of the API they were sent to.

aiohttp decoded `Content-Encoding` itself, and a body that did not decode went
wrong in three ways: read by a handler, a 500 in plain text and a traceback;
not read (a 401, a 404), another traceback after the answer; and a deflate body
cut short left the request waiting forever, holding its connection. So the
listeners are served with aiohttp's decoding off (SERVER_OPTIONS) and the
middleware here decodes gzip and deflate itself, before any handler runs,
refusing in the API's shape a body that does not decode (400), a coding it does
not know (415), or one that decodes past the body limit (413, a zip bomb).

What aiohttp still refuses before any handler runs (a request line or header
it cannot parse) is logged as one line, not a traceback: it is the client's
mistake, not the server's; llmgw.httpserver answers it in the listener's shape.
Its parser refused a URL or header past 8,190 bytes in its own words; it now
reads up to MAX_PARSED_LINE, and the middleware refuses past MAX_LINE in the
API's shape (414, 431), naming the header and its size.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import re
import sys
import zlib
from collections.abc import Callable
from email import errors, policy
from email.message import EmailMessage
from email.parser import BytesParser
from typing import Any

import attrs
import structlog
from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.typedefs import Handler, Middleware
from aiohttp.web_protocol import RequestPayloadError

log = structlog.get_logger(__name__)

# Answers status with message, in the shape of the API the request was sent to.
Answer = Callable[[web.Request, int, str], web.StreamResponse]

_IDENTITY = frozenset({"", "identity"})
_CODINGS = {"gzip": 16 + zlib.MAX_WBITS, "x-gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS}
_FORMS = frozenset({"application/x-www-form-urlencoded", "multipart/form-data"})
# A page's form (a sign-in, a project's models) is a few kilobytes; the client port would take 64 MiB.
MAX_FORM = 1024**2
_DECODED = web.RequestKey("llmgw.bodies.decoded", bytes)


class _Refused(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def _decompress(raw: bytes, coding: str, limit: int) -> bytes:
    """raw decoded as coding, at most limit bytes of it; _Refused saying what is wrong with it."""
    wbits = _CODINGS[coding]
    # Deflate as many clients send it: raw, without the zlib header RFC 9110 asks for.
    if coding == "deflate" and raw[:1] and raw[0] & 0x0F != 8:
        wbits = -zlib.MAX_WBITS
    decompressor = zlib.decompressobj(wbits)
    try:
        out = decompressor.decompress(raw, limit + 1)
    except zlib.error:
        raise _Refused(
            400,
            f"the request body is not {coding} as its Content-Encoding says; "
            "send it encoded as it says, or without Content-Encoding",
        ) from None
    if len(out) > limit:
        raise _Refused(413, f"the request body decodes to more than {limit} bytes, the most accepted here")
    if raw and not decompressor.eof:
        raise _Refused(400, f"the request body ends before its {coding} data does: it was cut short")
    return out


# The longest URL or header line taken, as aiohttp's parser took by default; a proxy in front has
# a limit of the same order (nginx: 8 KiB).
MAX_LINE = 8190
# What the parser reads of a request line before refusing it itself (llmgw.httpserver says so in the
# API's shape, knowing less): past MAX_LINE, so that what lies between is refused here, in more words.
MAX_PARSED_LINE = 64 * 1024
# And of a header: a byte more than of the request line, because the parser's refusal names only the
# limit it met, and that is how httpserver tells a URL too long (414) from a header (431).
MAX_PARSED_FIELD = MAX_PARSED_LINE + 1
# aiohttp's own bound on a request's headers, said here so that the refusal can say it.
MAX_HEADERS = 128


def _too_long(request: web.Request) -> tuple[int, str] | None:
    if len(request.raw_path) > MAX_LINE:
        return 414, f"the URL is {len(request.raw_path):,} bytes; at most {MAX_LINE:,} are taken"
    for name, value in request.raw_headers:
        if len(name) + len(value) + 2 > MAX_LINE:
            shown = name.decode("latin-1")[:100]
            return (
                431,
                f"the header {shown} is {len(name) + len(value) + 2:,} bytes; at most {MAX_LINE:,} are taken",
            )
    return None


def decode_bodies(answer: Answer, limit: int, raw_forms: frozenset[str] = frozenset()) -> Middleware:
    """A middleware decoding a body's Content-Encoding before any handler runs; read it with read().

    limit is the app's body limit, which the decoded body is held to as well. A URL or header past
    MAX_LINE is refused first. raw_forms: the paths whose multipart forms their handler reads with
    read_form, bytes and all (an upload passed on).
    """

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        too_long = _too_long(request)
        if too_long is not None:
            return answer(request, *too_long)
        coding = request.headers.get("Content-Encoding", "").strip().lower()
        if request.body_exists and coding not in _IDENTITY:
            refused = await _decode(request, coding, limit)
            if refused is not None:
                log.warning("refused a request body", path=request.path, reason=str(refused))
                response = answer(request, refused.status, str(refused))
                # What is left of the body cannot be told from a next request: the connection ends.
                response.force_close()
                return response
        if request.method == "POST" and request.content_type in _FORMS and request.path not in raw_forms:
            if request.content_length is not None and request.content_length > MAX_FORM:
                response = answer(request, 413, f"a form is at most {MAX_FORM:,} bytes here")
                response.force_close()
                return response
            # Parsed here, once (aiohttp keeps it for read_fields): a form that is not UTF-8, or a
            # multipart body that is not one, raised inside the handler, a 500.
            try:
                await request.post()
            except (ValueError, LookupError, RequestPayloadError) as exc:
                return answer(request, 400, f"the form could not be read: {exc}")
        return await handler(request)

    return middleware


async def _decode(request: web.Request, coding: str, limit: int) -> _Refused | None:
    if request.content.total_compressed_bytes is not None:
        # Decoded by aiohttp already (a server not given SERVER_OPTIONS): only its failure to report.
        try:
            await request.read()
        except RequestPayloadError as exc:
            return _Refused(
                400, f"the request body is not {coding} as its Content-Encoding says: {words(exc)}"
            )
        return None
    if coding not in _CODINGS:
        return _Refused(
            415, f"Content-Encoding {coding} is not one this server decodes; send gzip, deflate or none"
        )
    if request.content_type in _FORMS:
        return _Refused(415, "forms are taken without Content-Encoding; send this one as it is")
    raw = await request.read()
    try:
        # In a thread: up to the body limit of decompression would stall every other request.
        request[_DECODED] = await asyncio.to_thread(_decompress, raw, coding, limit)
    except _Refused as exc:
        return exc
    return None


async def read(request: web.Request) -> bytes:
    """The request's body, decoded from its Content-Encoding: what every handler reads."""
    decoded = request.get(_DECODED)
    return decoded if decoded is not None else await request.read()


async def read_fields(request: web.Request) -> dict[str, str]:
    """The text fields of the form sent, as decode_bodies parsed it; {} when the body is not a form."""
    if request.content_type not in _FORMS:
        return {}
    form = await request.post()
    return {name: value for name, value in form.items() if isinstance(value, str)}


async def read_text(request: web.Request) -> str:
    """The body as text in the charset it says (UTF-8 when it says none); ValueError in words when it is not.

    aiohttp's own text() raised UnicodeDecodeError, or LookupError for a charset Python does not
    know, and either was a 500.
    """
    body = await read(request)
    charset = request.charset or "utf-8"
    try:
        return body.decode(charset)
    except LookupError:
        raise ValueError(
            f"the Content-Type names a charset ({charset}) that is not known here; send UTF-8"
        ) from None
    except UnicodeDecodeError as exc:
        raise ValueError(
            f"the request body is not {charset} text (byte {exc.start + 1} is not); send it as UTF-8"
        ) from None


class BadForm(ValueError):
    """A body that is not the multipart form a route reads, in a sentence for its sender (status 400, 413)."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


@attrs.frozen
class Form:
    """A multipart form as it came (`raw`, to pass on) and its fields other than files (`fields`)."""

    raw: bytes
    fields: dict[str, str]
    # The names of its file fields.
    files: tuple[str, ...]


_MULTIPART = "multipart/form-data"
_CUT = (errors.StartBoundaryNotFoundDefect, errors.CloseBoundaryNotFoundDefect)


async def read_form(request: web.Request, limit: int | None = None) -> Form:
    """The body as a multipart form; BadForm in words when it is none or is over limit bytes."""
    too_large = BadForm(f"the request body is more than {limit or 0:,} bytes, the most this route takes", 413)
    if limit is not None and request.content_length is not None and request.content_length > limit:
        raise too_large
    if request.content_type != _MULTIPART:
        raise BadForm(
            f"this route takes a {_MULTIPART} form (the file and its fields), not {request.content_type}"
        )
    raw = await read(request)
    if limit is not None and len(raw) > limit:
        raise too_large
    content_type = request.headers.get("Content-Type", "")
    # In a thread past a screenful: an upload runs to megabytes.
    if len(raw) > 64 * 1024:
        return await asyncio.to_thread(_parse_form, content_type, raw)
    return _parse_form(content_type, raw)


def _parse_form(content_type: str, raw: bytes) -> Form:
    head = f"Content-Type: {content_type}\r\n\r\n".encode("latin-1", "replace")
    message = BytesParser(policy=policy.HTTP).parsebytes(head + raw)
    if not message.is_multipart() or any(isinstance(d, _CUT) for d in message.defects):
        raise BadForm(f"the {_MULTIPART} body is cut short or has no parts between its boundaries")
    fields: dict[str, str] = {}
    files: list[str] = []
    for part in message.iter_parts():
        assert isinstance(part, EmailMessage)
        name = part.get_param("name", header="content-disposition")
        if not isinstance(name, str):
            raise BadForm("every part of the form needs a name (Content-Disposition: form-data; name=...)")
        if part.get_filename() is not None:
            files.append(name)
            continue
        try:
            value = part.get_payload(decode=True)
            fields[name] = (
                value.decode(part.get_content_charset() or "utf-8") if isinstance(value, bytes) else ""
            )
        except (LookupError, UnicodeDecodeError):
            raise BadForm(f"the form's field {name!r} is not UTF-8 text") from None
    return Form(raw, fields, tuple(files))


# Deeper than any request of OpenAI's API (a tool's JSON Schema included) or of the admin API nests;
# Python's parser gives up near a thousand levels with a RecursionError, which was a 500.
MAX_DEPTH = 64
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89abcdefABCDEF]")


# An admin API change (a node's state, an org, a quota) is a few hundred bytes; the client port's
# limit is the gateway's 64 MiB, and /admin on it must take no more than the admin listener does.
MAX_ADMIN_BODY = 1024**2


class BadJson(ValueError):
    """A body that is not the JSON a route reads, in a sentence for its sender; status 400, or 413."""

    def __init__(self, message: str, status: int = 400, *, not_json: bool = False) -> None:
        super().__init__(message)
        self.status = status
        # Not JSON at all (rather than JSON this reader refuses): the route may say what it takes.
        self.not_json = not_json


async def read_json(request: web.Request, limit: int | None = None) -> Any:
    """The body's JSON value, decoded from its Content-Encoding; BadJson in words when it is not one.

    The one reader of every JSON route (the gateway's /v1, the admin API on either listener): the
    same depth and character rules wherever a body is JSON; limit, the most bytes the route takes
    (None: the app's own limit).
    """
    too_large = BadJson(f"the request body is more than {limit or 0:,} bytes, the most this route takes", 413)
    if limit is not None and request.content_length is not None and request.content_length > limit:
        raise too_large
    try:
        body = await read(request)
    except web.HTTPRequestEntityTooLarge:
        # Past the app's own limit (limit None): aiohttp's refusal, in plain text, skipped the
        # route's own words and shape.
        raise BadJson(
            f"the request body is more than {request.client_max_size:,} bytes, the most this route takes", 413
        ) from None
    if limit is not None and len(body) > limit:
        raise too_large
    # In a thread past a screenful: parsing and measuring up to the body limit would stall the loop.
    if len(body) > 64 * 1024:
        return await asyncio.to_thread(parse_json, body)
    return parse_json(body)


class _NotFinite(Exception):
    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.text = text


def _constant(text: str) -> float:
    raise _NotFinite(text)


def _finite(text: str) -> float:
    value = float(text)
    if math.isinf(value):
        raise _NotFinite(text)
    return value


def parse_json(body: bytes) -> Any:
    """body's JSON value; BadJson when it is not JSON, nests past MAX_DEPTH or holds half a character.

    Python reads NaN and Infinity, which are not JSON, and 1e400 as inf: none is a number llmgw
    can hold, compare or write back (llmgw.strictjson refuses them), so each is refused here.
    """
    try:
        value = json.loads(body, parse_constant=_constant, parse_float=_finite, parse_int=_whole)
    except _NotFinite as exc:
        raise BadJson(
            f"the request body holds the number {exc.text}, which JSON cannot carry; send a finite number"
        ) from None
    except RecursionError:
        raise BadJson(_too_deep()) from None
    except BadJson:
        raise
    except UnicodeDecodeError as exc:
        raise BadJson(
            f"the request body is not UTF-8 text (byte {exc.start + 1} is not); send it as UTF-8"
        ) from None
    except ValueError as exc:
        raise BadJson(f"the request body is not valid JSON: {exc}", not_json=True) from None
    if _depth_over(body, value, MAX_DEPTH):
        raise BadJson(_too_deep())
    # json.loads joins an escaped pair (\ud83d\ude00, as json.dumps writes an emoji) into one
    # character; a half left alone cannot be written to the store, a log or a reply.
    if _SURROGATE_ESCAPE.search(body) and _has_half_character(value):
        raise BadJson(
            "the request body has an escape (\\uD800-\\uDFFF) that is half a character; "
            "send the whole character, or both halves of its pair"
        )
    return value


# More digits than any whole number the APIs take (a seed is at most 20); Python reads up to 4,300
# and then refused the body in words about its own interpreter.
_MAX_DIGITS = 100


def _whole(text: str) -> int:
    if len(text) > _MAX_DIGITS:
        raise BadJson(
            f"the request body holds a whole number of {len(text):,} digits; at most {_MAX_DIGITS} are taken"
        )
    return int(text)


def _too_deep() -> str:
    return f"the request body nests deeper than {MAX_DEPTH} levels of arrays and objects"


def _depth_over(body: bytes, value: Any, limit: int) -> bool:
    """Whether body, parsed as value, nests its arrays and objects deeper than limit."""
    # Each level opens a bracket: a body with no more than limit of them (most requests) cannot be
    # over, whatever its strings hold; counting them is a pass in C.
    if body.count(b"[") + body.count(b"{") <= limit:
        return False
    # Otherwise the parsed value, a level at a time: its containers, never its text. Stripping the
    # strings from the bytes with a regular expression cost a millisecond on a 40 KB conversation.
    level = [value] if isinstance(value, dict | list) else []
    for _ in range(limit):
        if not level:
            return False
        inner: list[Any] = []
        for item in level:
            inner.extend(
                v for v in (item.values() if isinstance(item, dict) else item) if isinstance(v, dict | list)
            )
        level = inner
    return bool(level)


def _has_half_character(value: Any) -> bool:
    pending = [value]
    while pending:
        item = pending.pop()
        if isinstance(item, str):
            if any("\ud800" <= ch <= "\udfff" for ch in item):
                return True
        elif isinstance(item, dict):
            pending.extend(item.keys())
            pending.extend(item.values())
        elif isinstance(item, list):
            pending.extend(item)
    return False


def words(exc: BaseException) -> str:
    """What went wrong, as aiohttp says it, without its class names and status codes."""
    cause = exc.__cause__ or exc
    if isinstance(cause, HttpProcessingError):
        return cause.message or type(cause).__name__
    return str(cause) or type(cause).__name__


class ServerLogger(logging.Logger):
    """aiohttp's server logger, for the listeners: a client's malformed request is one line, not a traceback.

    aiohttp logs what it refuses before any handler (a request line or header it cannot parse)
    with the traceback of its parser; a client could fill the log with them. Anything else (a
    fault of llmgw's) keeps its traceback.
    """

    def __init__(self) -> None:
        super().__init__("aiohttp.server")
        self.parent = logging.getLogger("aiohttp")

    def exception(self, msg: object, *args: object, exc_info: Any = True, **kwargs: Any) -> None:
        exc = exc_info if isinstance(exc_info, BaseException) else sys.exc_info()[1]
        if isinstance(exc, HttpProcessingError | RequestPayloadError):
            log.warning("refused a request that could not be read", reason=words(exc))
            return
        super().exception(msg, *args, exc_info=exc_info, **kwargs)


SERVER_LOGGER = ServerLogger()

# What every llmgw listener's aiohttp runner is given: decoding is decode_bodies' (see above), and so
# is refusing a URL or header past MAX_LINE.
SERVER_OPTIONS: dict[str, Any] = {
    "logger": SERVER_LOGGER,
    "auto_decompress": False,
    "max_line_size": MAX_PARSED_LINE,
    "max_field_size": MAX_PARSED_FIELD,
    "max_headers": MAX_HEADERS,
}
