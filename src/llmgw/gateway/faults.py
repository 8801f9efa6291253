"""An engine that misbehaves: what the client gets in place of what the engine sent.

An engine is a neighbour, not an authority. A 500 or 502 in text/plain or
HTML (a crashed worker, a proxy in front of it), a 200 whose body is not JSON,
a stream whose events are not server-sent events of JSON: passed on, each
broke OpenAI's clients with a parse error that names neither the model nor
the replica. The client gets an error in OpenAI's shape instead; the log
names the replica and holds a bounded excerpt of what it sent.
"""

from __future__ import annotations

import functools
import json
from urllib.parse import urlsplit

import structlog

from llmgw import strictjson
from llmgw.gateway.errors import ApiError
from llmgw.gateway.pipeline import Call

log = structlog.get_logger(__name__)

# How much of what a misbehaving engine sent is logged: enough to recognise an nginx error page or a
# Python traceback's last line, not a megabyte of HTML per request.
EXCERPT = 500
# How much of it the client's error quotes.
_SAID = 120
# What stands in a reply where an upstream endpoint quoted the key the gateway sent it.
_STRUCK = b"[its key]"


class EngineFailed(ApiError):
    """The engine failed before anything of its reply reached the client: another replica may take the
    request, once (gateway/router.py)."""


class EngineRefused(EngineFailed):
    """The engine did not take the connection: nothing of the request reached it, so another replica may."""


def where(call: Call) -> str:
    """The replica's node, the endpoint's id and host, or the engine's address without a route."""
    route = call.route
    if route is not None:
        return f"endpoint {route.shard_id} ({route.node_id})" if route.url else route.node_id
    return urlsplit(call.endpoint).netloc or call.endpoint


def scrub(call: Call, data: bytes) -> bytes:
    """data without the key the gateway sent (an upstream may quote it back): never logged, never shown."""
    route = call.route
    if route is None or not route.secret:
        return data
    return data.replace(route.secret.encode(), _STRUCK)


class KeyStrike:
    """Strikes the key the gateway sent out of a reply that arrives in pieces, a key split between two
    of them included: an end of a piece that may begin the key waits for the next piece (at most its
    length less one byte), and nothing else does, so a stream's events are not held back."""

    __slots__ = ("_ends", "_held", "_key")

    def __init__(self, key: str) -> None:
        self._key = key.encode()
        self._ends = _key_starts(self._key)
        self._held = b""

    def feed(self, data: bytes) -> bytes:
        """What of data may go to the client now."""
        if self._held:
            data, self._held = self._held + data, b""
        if data.find(self._key) != -1:
            data = data.replace(self._key, _STRUCK)
        # Looked up by the last byte: an event's blank line begins no key, and costs one lookup.
        for start in self._ends.get(data[-1], ()) if data else ():
            if data.endswith(start):
                self._held = data[-len(start) :]
                return data[: -len(start)]
        return data

    def end(self) -> bytes:
        """What was held at the reply's end: not the key, which never came whole."""
        held, self._held = self._held, b""
        return held


@functools.lru_cache(maxsize=64)
def _key_starts(key: bytes) -> dict[int, tuple[bytes, ...]]:
    """key's starts shorter than itself by their last byte, longest first: once per key, not per request."""
    ends: dict[int, list[bytes]] = {}
    for length in range(len(key) - 1, 0, -1):
        ends.setdefault(key[length - 1], []).append(key[:length])
    return {byte: tuple(starts) for byte, starts in ends.items()}


def key_strike(call: Call) -> KeyStrike | None:
    """A KeyStrike for call's reply; None when the gateway sent no key (a replica of the fleet)."""
    route = call.route
    return KeyStrike(route.secret) if route is not None and route.secret else None


def excerpt(data: bytes, limit: int = EXCERPT) -> str:
    """The start of what an engine sent, as text on one line."""
    text = data[:limit].decode("utf-8", "replace")
    return " ".join(text.split()) + ("…" if len(data) > limit else "")


def _log(call: Call, what: str, status: int, content_type: str, data: bytes) -> None:
    route = call.route
    data = scrub(call, data)
    log.warning(
        what,
        model=call.served_model or call.model,
        node=route.node_id if route is not None else None,
        replica=route.shard_id if route is not None else None,
        endpoint=call.endpoint,
        status=status,
        content_type=content_type,
        sent=excerpt(data),
        request_id=call.request_id,
    )


async def server_error(call: Call, status: int, content_type: str, body: bytes) -> EngineFailed:
    """The error for an engine's 5xx: its own words when it said them in OpenAI's shape, else a 502.

    Words of a dead engine that name no cause get the cause the control plane knows, which may
    take a moment to arrive (EngineRoute.known_cause).
    """
    _log(call, "the engine answered with a server error", status, content_type, body)
    body = scrub(call, body)
    model = call.served_model or call.model
    try:
        said = json.loads(body)["error"]
        message = said if isinstance(said, str) else said["message"]
    except (ValueError, KeyError, TypeError):
        shown = f": {excerpt(body, _SAID)}" if body.strip() else ""
        return EngineFailed(
            502,
            f"{model} on {where(call)} failed: it answered {status} with {content_type or 'no type'}, "
            f"not an error in OpenAI's shape{shown}",
            type="server_error",
            code="engine_error",
        )
    if not isinstance(message, str):
        message = strictjson.dumps(message)
    cause = await call.route.known_cause(message) if call.route is not None else ""
    if cause:
        message = f"{message.rstrip()} ({cause})"
    return EngineFailed(status, f"{model} on {where(call)} failed: {message}", type="server_error")


def not_json(call: Call, status: int, content_type: str, data: bytes) -> EngineFailed:
    """The 502 for a reply that is not the JSON object an OpenAI route answers with."""
    _log(call, "the engine's reply is not JSON", status, content_type, data)
    data = scrub(call, data)
    shown = f": {excerpt(data, _SAID)}" if data.strip() else ""
    return EngineFailed(
        502,
        f"{(call.served_model or call.model)} on {where(call)} sent a reply that is not JSON "
        f"({content_type or 'no type'}){shown}",
        type="server_error",
        code="engine_error",
    )


def looks_like_json(first: bytes) -> bool:
    """Whether a reply's first bytes may begin a JSON object or array (a cheap check, not a parse)."""
    start = first.lstrip()[:1]
    return start in (b"{", b"[")


def ends_like_json(last: bytes | bytearray) -> bool:
    """Whether a reply's last bytes may end one: a body cut short ends elsewhere."""
    end = bytes(last[-64:]).rstrip()[-1:]
    return end in (b"}", b"]")


def stream_failed(call: Call, what: str, data: bytes = b"") -> ApiError:
    """The error that ends a stream the engine broke (cut, malformed), logged with what it sent."""
    _log(call, f"the engine broke a stream under way: {what}", 200, "text/event-stream", data)
    return ApiError(
        502,
        f"{(call.served_model or call.model)} on {where(call)} broke off its reply: {what}",
        type="server_error",
        code="engine_error",
    )
