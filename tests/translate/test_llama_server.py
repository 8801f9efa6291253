"""The translations against a real llama-server, which speaks every API itself: the same request,
asked natively and translated onto its chat completions, must read the same prompt and, greedy,
say the same words.

A prompt the translation renders differently from llama-server's own translation would show as
a different count of input tokens; replies differ only where the translation's choices do. The
chat chunks are the engine's own, recorded as it streams them, tool calls included.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest
import requests

from llmgw.engines.base import LaunchSpec
from llmgw.engines.llamacpp import LlamaCppEngine
from llmgw.translate import messages, responses
from tests import needs

from .sdk import checked_message, checked_message_stream, checked_response, response_events

ROOT = Path(__file__).resolve().parents[2]
MODEL = "tiny"

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("llama_server")]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """llama-server on the tiny model, one slot of 4,096 tokens; its base URL."""
    tmp = tmp_path_factory.mktemp("llama-server")
    model = tmp / "tiny.gguf"
    subprocess.run(
        [
            sys.executable,
            str(ROOT / "scripts" / "make_tiny_gguf.py"),
            "--vocab",
            str(needs.LLAMA_BUILD / "ggml-vocab-llama-spm.gguf"),
            "--out",
            str(model),
            "--context",
            "4096",
        ],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    engine = LlamaCppEngine()
    spec = LaunchSpec(
        model=MODEL,
        port=_free_port(),
        model_path=str(model),
        context_size=4096,
        parallel=1,
        binary=str(needs.LLAMA_BUILD / "bin" / "llama-server"),
        args=("--threads", "2", "--jinja"),
    )
    log = tmp / "llama-server.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            engine.command(spec),
            env={**os.environ, **engine.environment(spec)},
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    base = f"http://{spec.host}:{spec.port}"

    def said() -> str:
        return log.read_text(errors="replace")[-3000:]

    try:
        deadline = time.monotonic() + 60
        while True:
            if process.poll() is not None:
                pytest.fail(f"llama-server exited with {process.returncode}:\n{said()}")
            try:
                if requests.get(base + "/health", timeout=5).status_code == 200:
                    break
            except requests.ConnectionError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"llama-server did not become healthy within 60 s:\n{said()}")
            # Polling, not waiting for something to happen: the next probe.
            time.sleep(0.1)
        yield base
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


Clients = tuple[anthropic.Anthropic, openai.OpenAI]


@pytest.fixture(scope="module")
def clients(server: str) -> Iterator[Clients]:
    """The official clients, straight at llama-server; closed with the module, as their pools hold sockets."""
    with (
        anthropic.Anthropic(api_key="k", base_url=server) as claude_client,
        openai.OpenAI(api_key="k", base_url=server + "/v1") as gpt_client,
    ):
        yield claude_client, gpt_client


def _chat(server: str, body: dict[str, Any]) -> dict[str, Any]:
    reply = requests.post(server + "/v1/chat/completions", json=body, timeout=60)
    assert reply.status_code == 200, reply.text
    result: dict[str, Any] = reply.json()
    return result


def _chat_events(server: str, body: dict[str, Any]) -> list[bytes]:
    """The data of each event of the engine's chat stream, as it sent them."""
    events = []
    with requests.post(server + "/v1/chat/completions", json=body, stream=True, timeout=60) as reply:
        assert reply.status_code == 200, reply.text
        for line in reply.iter_lines():
            if line.startswith(b"data: "):
                events.append(line.removeprefix(b"data: "))
    assert events[-1] == b"[DONE]"
    return events


def _input_tokens(usage: Any) -> int:
    """All of a Messages prompt: what was computed and what came from the engine's cache."""
    return int(usage.input_tokens) + int(usage.cache_read_input_tokens or 0)


GREEDY = {"temperature": 0}
WEATHER = {
    "name": "get_weather",
    "description": "The weather in a city",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}

CONVERSATIONS = {
    "a question": {"system": "Be brief.", "messages": [{"role": "user", "content": "Hello there"}]},
    "several turns": {
        "system": [{"type": "text", "text": "You answer in one word."}],
        "messages": [
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": [{"type": "text", "text": "Hello"}]},
            {"role": "user", "content": [{"type": "text", "text": "How are you?"}]},
        ],
    },
    "a prefilled reply": {
        "messages": [
            {"role": "user", "content": "Hello there"},
            {"role": "assistant", "content": "Sure, here"},
        ]
    },
    "a tool round trip": {
        "tools": [WEATHER],
        "messages": [
            {"role": "user", "content": "Weather in Paris?"},
            {
                "role": "assistant",
                "content": [
                    {"type": "tool_use", "id": "call_1", "name": "get_weather", "input": {"city": "Paris"}}
                ],
            },
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": "call_1", "content": "18C and sunny"}],
            },
        ],
    },
}


class TestMessages:
    @pytest.mark.parametrize("name", list(CONVERSATIONS))
    def test_a_translated_request_reads_the_prompt_and_says_the_words_of_the_native_one(
        self, server: str, clients: Clients, name: str
    ) -> None:
        body = {"model": MODEL, "max_tokens": 6, **CONVERSATIONS[name]}
        # Greedy both ways; the SDK no longer takes temperature itself, llama-server still does.
        native = clients[0].messages.create(**body, extra_body=GREEDY)
        chat = _chat(server, messages.request_to_chat({**body, **GREEDY}))
        translated = checked_message(messages.reply_from_chat(chat, MODEL))
        assert _input_tokens(translated.usage) == _input_tokens(native.usage)
        assert translated.usage.output_tokens == native.usage.output_tokens
        assert [b.model_dump() for b in translated.content] == [b.model_dump() for b in native.content]
        assert translated.stop_reason == native.stop_reason

    def test_a_recorded_stream_translates_into_the_message_the_native_stream_makes(
        self, server: str, clients: Clients
    ) -> None:
        body = {"model": MODEL, "max_tokens": 8, **CONVERSATIONS["several turns"]}
        events = _chat_events(server, messages.request_to_chat({**body, **GREEDY, "stream": True}))
        stream = messages.MessagesStream(MODEL)
        translated = checked_message_stream(b"".join(stream.feed(e) for e in events) + stream.finish())
        with clients[0].messages.stream(**body, extra_body=GREEDY) as native_stream:
            native = native_stream.get_final_message()
        assert [b.model_dump() for b in translated.content] == [b.model_dump() for b in native.content]
        assert translated.stop_reason == native.stop_reason
        assert translated.usage.output_tokens == native.usage.output_tokens == stream.completion_tokens

    def test_count_tokens_through_the_translation_counts_what_the_native_route_counts(
        self, server: str, clients: Clients
    ) -> None:
        body = {"model": MODEL, **CONVERSATIONS["a question"]}
        native = clients[0].messages.count_tokens(**body)
        # llama-server's /tokenize takes text, not messages: the prompt comes from its /apply-template.
        chat = messages.count_tokens_request(body)
        prompt = requests.post(server + "/apply-template", json=chat, timeout=60).json()["prompt"]
        tokenized = requests.post(
            server + "/tokenize", json={"content": prompt, "add_special": True}, timeout=60
        ).json()
        assert messages.count_tokens_reply(tokenized) == {"input_tokens": native.input_tokens}


class TestResponses:
    """llama-server's own Responses route says `completed` of a reply cut at the token limit, where
    OpenAI (and the translation) say `incomplete`: the words and the counts are compared, and the
    status against the engine's finish_reason."""

    def test_a_translated_request_reads_the_prompt_and_says_the_words_of_the_native_one(
        self, server: str, clients: Clients
    ) -> None:
        body = {
            "model": MODEL,
            "instructions": "Be brief.",
            "input": "Hello there",
            "max_output_tokens": 6,
            **GREEDY,
        }
        native = clients[1].responses.create(**body)
        chat = _chat(server, responses.request_to_chat(body))
        translated = checked_response(responses.reply_from_chat(chat, MODEL, request=body))
        assert translated.usage is not None and native.usage is not None
        assert translated.usage.input_tokens == native.usage.input_tokens
        assert translated.usage.output_tokens == native.usage.output_tokens
        assert translated.output_text == native.output_text
        cut = chat["choices"][0]["finish_reason"] == "length"
        assert translated.status == ("incomplete" if cut else "completed")

    def test_a_recorded_stream_translates_into_the_response_the_native_one_makes(
        self, server: str, clients: Clients
    ) -> None:
        body = {
            "model": MODEL,
            "input": [{"role": "user", "content": "Hi"}],
            "max_output_tokens": 8,
            **GREEDY,
        }
        events = _chat_events(server, responses.request_to_chat({**body, "stream": True}))
        stream = responses.ResponsesStream(MODEL, request=body)
        said = response_events(b"".join(stream.feed(e) for e in events) + stream.finish())
        native = clients[1].responses.create(**body)
        assert native.usage is not None
        last = said[-1]["response"]
        text = "".join(
            p["text"] for item in last["output"] if item["type"] == "message" for p in item["content"]
        )
        assert text == native.output_text
        assert last["usage"]["output_tokens"] == native.usage.output_tokens == stream.completion_tokens
        finish = [
            json.loads(e)["choices"][0]["finish_reason"] for e in events[:-1] if b'"finish_reason":"' in e
        ]
        assert said[-1]["type"] == ("response.incomplete" if finish == ["length"] else "response.completed")
