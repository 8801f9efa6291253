"""A streamed reply on its way to the client: its usage read, what it did not ask for hidden, its end held.

Server-sent events, as every engine llmgw runs sends them (`data: {...}` and a
blank line). The tap passes whole events on as they complete, so that the
client gets each token when the engine sends it, and keeps back three things:

- `data: [DONE]` and whatever follows it, until the gateway has journaled the
  request's usage: a client that has the end of its reply has been counted.
- When the gateway asked for usage on the client's behalf, the usage chunk
  (`"choices":[]` and the usage). llama-server moves its `timings` from the
  finish chunk into that chunk when usage is asked for; they are put back where
  the client would have had them, so its bytes are the engine's own.
- For the same reason, while hiding, the finish chunk waits for the next event.

The APIs whose streams are typed events (Anthropic's Messages, OpenAI's
Responses) end with their own last event (`message_stop`,
`response.completed`), held back the same way, and report usage in events of
their own (apis.StreamShape says which); nothing of theirs is hidden.

An event that is not one (a line that is no field of an event, data that is
neither a JSON object nor `[DONE]`) is a MalformedStream: the proxy ends the
stream with an error event rather than pass on what no client can parse.
"""

from __future__ import annotations

import json
import re

from llmgw.gateway.apis import StreamShape
from llmgw.gateway.usage import find_usage

_END = b"\n\n"
_DONE = b"data: [DONE]"
_NO_CHOICES = re.compile(rb'"choices"\s*:\s*\[\s*\]')
_FINISHED = re.compile(rb'"finish_reason"\s*:\s*"')
_TIMINGS = re.compile(rb',\s*"timings"\s*:\s*')
_DATA = b"data: {"
_FIELDS = (b":", b"event:", b"id:", b"retry:")


class MalformedStream(Exception):
    """The engine sent something that is not a server-sent event of JSON (`event` holds it); `passed` is
    what the client may still have of the events before it."""

    def __init__(self, event: bytes, passed: bytes) -> None:
        super().__init__("it sent an event that is not JSON")
        self.event = event
        self.passed = passed


def _first_bad(ready: bytes) -> int:
    """Where the first of ready's whole events that is not an event of JSON starts; -1 when none."""
    events = ready.count(_END)
    # Most chunks: `data: {...}` events and nothing else, counted rather than split.
    if ready.count(b"\n") == 2 * events and ready.count(b"\n" + _DATA) + ready.startswith(_DATA) == events:
        return -1
    at = 0
    for event in ready.split(_END)[:-1]:
        for line in event.split(b"\n"):
            line = line.rstrip(b"\r")
            if line.startswith(b"data:"):
                data = line[5:].lstrip()
                if not (data.startswith(b"{") or data.startswith(b"[DONE]")):
                    return at
            elif line and not line.startswith(_FIELDS):
                return at
        at += len(event) + len(_END)
    return -1


class StreamTap:
    """Feed it the engine's bytes as they come; write what it returns; at the end, write end()."""

    __slots__ = ("_end", "_finish", "_held", "_hide", "_partial", "_shape", "events", "prompt", "usage")

    def __init__(self, hide_usage: bool, shape: StreamShape) -> None:
        self._hide = hide_usage
        self._shape = shape
        self._end = shape.end
        self._partial = b""  # the start of an event not yet complete
        self._held = b""  # from `data: [DONE]` on
        self._finish = b""  # while hiding: the finish event, waiting for the usage chunk's timings
        # The last usage the engine reported: (prompt_tokens, completion_tokens).
        self.usage: tuple[int, int] | None = None
        # How many events of generated text have gone to the client: what it was given, when the engine
        # never says.
        self.events = 0
        # The prompt tokens the stream reported before its last word on usage (Anthropic's message_start).
        self.prompt: int | None = None

    def feed(self, chunk: bytes) -> bytes:
        """What of the reply the client may have now: the whole events before the end."""
        data = self._partial + chunk if self._partial else chunk
        cut = data.rfind(_END)
        if cut < 0:
            self._partial = data
            return b""
        cut += len(_END)
        ready, self._partial = data[:cut], data[cut:]
        if self._held:
            self._held += ready
            return b""
        if (bad := _first_bad(ready)) >= 0:
            event = ready[bad:].split(_END, 1)[0]
            raise MalformedStream(event, self._passed(ready[:bad]) if bad else b"")
        return self._passed(ready)

    def _passed(self, ready: bytes) -> bytes:
        """What the client may have of ready, whole events that they are."""
        shape = self._shape
        if shape.usage is None:
            if (found := find_usage(ready)) is not None:
                self.usage = found
        elif b'"usage"' in ready:
            self._typed_usage(ready)
        out = self._hidden(ready) if self._hide else self._to_done(ready)
        self.events += out.count(shape.delta) if shape.delta else out.count(_END)
        return out

    def _typed_usage(self, ready: bytes) -> None:
        """Usage from the typed events that mention it (a few per stream, each parsed)."""
        assert self._shape.usage is not None
        for event in ready.split(_END)[:-1]:
            if b'"usage"' not in event:
                continue
            data = b"\n".join(line[5:].lstrip() for line in event.split(b"\n") if line.startswith(b"data:"))
            try:
                value = json.loads(data)
            except ValueError:
                continue
            if not isinstance(value, dict):
                continue
            prompt, completion, final = self._shape.usage(value)
            if prompt is not None:
                self.prompt = prompt
            if final and completion is not None and self.prompt is not None:
                self.usage = (self.prompt, completion)

    def _to_done(self, ready: bytes) -> bytes:
        # At an event's start only: the words may be in generated text too.
        done = 0 if ready.startswith(self._end) else ready.find(_END + self._end)
        if done < 0:
            return ready
        if done:
            done += len(_END)
        self._held = ready[done:]
        return ready[:done]

    def end(self) -> bytes:
        """What is left once the engine's reply is over: the end of the stream, as the engine sent it."""
        rest = self._finish + self._held + self._partial
        self._finish = self._held = self._partial = b""
        return rest

    def _hidden(self, ready: bytes) -> bytes:
        out: list[bytes] = []
        for event in ready.split(_END)[:-1]:
            event += _END
            if self._held:
                self._held += event
            elif event.startswith(_DONE):
                self._held = self._finish + event
                self._finish = b""
            elif b'"usage"' in event and _NO_CHOICES.search(event):
                self._finish = _with_timings(self._finish, event)
            else:
                if self._finish:
                    out.append(self._finish)
                    self._finish = b""
                if _FINISHED.search(event):
                    self._finish = event
                else:
                    out.append(event)
        return b"".join(out)


def _with_timings(finish: bytes, usage_event: bytes) -> bytes:
    """The finish event with the usage chunk's `timings` put back as its last member, where llama-server
    puts them when not asked for usage."""
    found = _TIMINGS.search(usage_event)
    close = finish.rfind(b"}")
    if found is None or close < 0 or b'"timings"' in finish:
        return finish
    last = usage_event.rfind(b"}")
    value = usage_event[found.end() : last]
    try:
        json.loads(value)
    except ValueError:
        # Not the last member after all: the finish event stays as it came.
        return finish
    return finish[:close] + usage_event[found.start() : last] + finish[close:]
