"""A request for an API its engine does not speak, sent as chat completions and its answer said back.

Which APIs an engine serves itself is its module's to say (`native_apis`,
engines/<kind>.py); the router's route carries it. A Messages or Responses
request for a replica or endpoint without that API goes to its
`/v1/chat/completions`, turned into a chat request by llmgw/translate/, and
the reply (or each whole event of the stream, as the proxy passes them) is
turned back, so the client sees its own API either way. Everything else the
proxy does still holds: the chat stream is checked and its usage read as it
passes, its end held until the request is journaled; what the request is
charged is the engine's chat usage.
"""

from __future__ import annotations

import json
from typing import Any

from llmgw.engines.base import MESSAGES, RESPONSES
from llmgw.gateway.apis import APIS, ModelKind
from llmgw.gateway.errors import ApiError
from llmgw.translate import messages, responses
from llmgw.translate.chat import UpstreamError

CHAT_PATH = "/v1/chat/completions"
# The APIs the gateway can translate onto chat completions.
TRANSLATED = frozenset({MESSAGES, RESPONSES})
_END = b"\n\n"


class Translation:
    """One request's translation: the chat body to send, and how its reply and stream are said back."""

    def __init__(self, api: str, payload: dict[str, Any], model: str) -> None:
        """api: MESSAGES or RESPONSES; payload, the request as it goes to the engine; model, the name the
        client asked for, which the reply carries."""
        self._api = api
        self._payload = payload
        self._model = model
        self._stream: messages.MessagesStream | responses.ResponsesStream
        if api == MESSAGES:
            chat = messages.request_to_chat(payload)
            stops = payload.get("stop_sequences")
            self._stops = [s for s in stops if isinstance(s, str)] if isinstance(stops, list) else []
            self._stream = messages.MessagesStream(model, stop_sequences=self._stops)
        else:
            chat = responses.request_to_chat(payload)
            self._stops = []
            self._stream = responses.ResponsesStream(model, request=payload)
        self.body = json.dumps(chat, ensure_ascii=False).encode()

    @property
    def usage(self) -> tuple[int, int] | None:
        """What the engine counted, once it has said both."""
        prompt, completion = self._stream.prompt_tokens, self._stream.completion_tokens
        return (prompt, completion) if prompt is not None and completion is not None else None

    def reply(self, chat: bytes) -> bytes:
        """A whole chat completion said in the client's API."""
        try:
            value = json.loads(chat)
            if not isinstance(value, dict):
                raise UpstreamError("the engine's reply is not a JSON object")
            if self._api == MESSAGES:
                said = messages.reply_from_chat(value, self._model, stop_sequences=self._stops)
            else:
                said = responses.reply_from_chat(value, self._model, request=self._payload)
        except (ValueError, UpstreamError) as exc:
            raise ApiError(
                502,
                f"the engine's chat completion for {self._model} could not be said in the client's API: "
                f"{exc}",
                type="server_error",
                code="engine_error",
            ) from None
        return json.dumps(said, ensure_ascii=False).encode()

    def events(self, ready: bytes) -> bytes:
        """Whole chat events (as the stream tap passes them) said as the client's API's events."""
        out = bytearray()
        for event in ready.split(_END)[:-1]:
            data = b"\n".join(line[5:].lstrip() for line in event.split(b"\n") if line.startswith(b"data:"))
            if data:
                out += self._stream.feed(data)
        return bytes(out)

    def finish(self) -> bytes:
        """The stream's end, for an engine that closed it without `[DONE]`; nothing once it has ended."""
        return b"" if self._stream.finished else self._stream.finish()

    def error_event(self, error: ApiError) -> bytes:
        """The event ending a stream the engine broke, in the client's API."""
        return b"" if self._stream.finished else self._stream.error_event(error.message)


def apis_served(kind: ModelKind, natives: list[frozenset[str]]) -> tuple[list[str], list[str]]:
    """(the APIs of kind a model's engines all serve themselves, those the gateway translates for it).

    natives: each of its engines' `native_apis` (an endpoint's: OpenAI's); none known, none listed.
    """
    if not natives:
        return [], []
    names = [api.name for api in APIS if api.kind == kind]
    native = [name for name in names if all(name in n for n in natives)]
    translated = [name for name in names if name in TRANSLATED and name not in native]
    return native, translated
