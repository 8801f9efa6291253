"""The prompt bound admission reserves: counted on the text that reaches the model, not on the JSON."""

from __future__ import annotations

import json
from typing import Any

from llmgw.gateway.apis import CHAT, COMPLETIONS, EMBEDDINGS, MESSAGES, RERANK, RESPONSES, Api
from llmgw.gateway.prompts import (
    MOST_PROMPT_TOKENS,
    TEMPLATE_OVERHEAD,
    TOOLS_TOKENS,
    TURN_TOKENS,
    prompt_bound,
)

MODEL = "sim-chat"


def _reserved(api: Api, payload: dict[str, Any], *, ascii_escapes: bool = False) -> int:
    """What admission reserves for payload's prompt, sent with its non-ASCII as \\u escapes or not."""
    body = json.dumps(payload, ensure_ascii=ascii_escapes).encode()
    return api.reserved_prompt(payload, len(body))


def _chat(text: str, **fields: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": text}], **fields}


class TestTheTextThatReachesTheModel:
    def test_a_prompt_of_400_one_letter_words_reserves_less_than_a_token_per_byte_of_its_body(self) -> None:
        payload = _chat(" ".join(["a"] * 400), max_tokens=1)
        reserved = _reserved(CHAT, payload)
        # 799 bytes of text, its turn and the template: under the 1,012 of a token per byte of the body.
        assert reserved == TEMPLATE_OVERHEAD + TURN_TOKENS + len('"user"') + 801
        assert reserved < len(json.dumps(payload)) + TEMPLATE_OVERHEAD

    def test_cjk_sent_as_unicode_escapes_reserves_its_decoded_bytes_not_six_a_character(self) -> None:
        payload = _chat("汉" * 400, max_tokens=1)
        escaped = _reserved(CHAT, payload, ascii_escapes=True)
        assert escaped == _reserved(CHAT, payload)
        # Three bytes a character in UTF-8; the body spells each in six.
        assert 1200 < escaped < 1200 + TEMPLATE_OVERHEAD + 2 * TURN_TOKENS
        assert len(json.dumps(payload).encode()) > 2400

    def test_fields_that_only_steer_generation_cost_nothing(self) -> None:
        bare = _chat("hello there")
        steered = _chat(
            "hello there",
            max_tokens=100,
            temperature=0.2,
            top_p=0.9,
            stop=["x" * 500],
            logit_bias={str(i): 1 for i in range(200)},
            stream=True,
            stream_options={"include_usage": True},
            user="someone-with-a-long-name" * 10,
        )
        assert prompt_bound(steered) == prompt_bound(bare)

    def test_a_field_the_gateway_does_not_know_costs_at_least_its_json(self) -> None:
        documents = [{"title": "a" * 300, "text": "b" * 700}]
        bare = _chat("hello")
        assert prompt_bound({**bare, "documents": documents}) - prompt_bound(bare) >= len(
            json.dumps(documents)
        )

    def test_tools_cost_their_json_written_with_indentation_and_a_preamble(self) -> None:
        tool = {
            "type": "function",
            "function": {
                "name": "search",
                "description": 'Finds\nthings "quoted"',
                "parameters": {"type": "object", "properties": {"q": {"type": "string"}}},
            },
        }
        bare = _chat("hello")
        added = prompt_bound({**bare, "tools": [tool]}) - prompt_bound(bare)
        assert added >= TOOLS_TOKENS + len(json.dumps(tool, ensure_ascii=False, indent=0).encode())

    def test_a_translated_tool_calls_input_counts_as_the_translation_escapes_it(self) -> None:
        # The Messages translation writes a tool_use block's input as arguments with Python's json:
        # non-ASCII as \u escapes, six bytes a character.
        call = {"type": "tool_use", "id": "toolu_1", "name": "note", "input": {"text": "汉" * 100}}
        payload = {
            "model": MODEL,
            "max_tokens": 8,
            "messages": [{"role": "assistant", "content": [call]}],
        }
        assert _reserved(MESSAGES, payload) > 600

    def test_a_rerank_counts_its_query_once_for_each_document(self) -> None:
        one = {"model": MODEL, "query": "q" * 1000, "documents": ["d"]}
        three = {**one, "documents": ["d", "d", "d"]}
        assert _reserved(RERANK, three) - _reserved(RERANK, one) > 2 * 1000

    def test_token_ids_count_one_token_each(self) -> None:
        ids = list(range(30_000, 30_500))
        for api, field in ((COMPLETIONS, "prompt"), (EMBEDDINGS, "input")):
            assert 500 <= _reserved(api, {"model": MODEL, field: ids}) < 500 + TEMPLATE_OVERHEAD + 16

    def test_a_responses_input_and_its_instructions_count_as_turns(self) -> None:
        payload = {"model": MODEL, "instructions": "be brief " * 50, "input": "hello " * 100}
        assert _reserved(RESPONSES, payload) >= 450 + 600 + 2 * TURN_TOKENS

    def test_each_turn_costs_its_markers_however_little_it_says(self) -> None:
        payload = {"model": MODEL, "messages": [{"role": "user", "content": ""}] * 500}
        assert _reserved(CHAT, payload) >= 500 * TURN_TOKENS

    def test_no_request_reserves_more_than_the_most_any_engine_takes(self) -> None:
        payload = {"model": MODEL, "query": "q" * 100_000, "documents": ["d"] * 10_000}
        assert _reserved(RERANK, payload) == MOST_PROMPT_TOKENS
