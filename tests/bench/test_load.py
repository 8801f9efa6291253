"""Each figure of `ctl bench` computed from a stream whose chunks arrive at the times a fake clock says."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator

import pytest

from llmgw.bench.engineload import EngineLoad
from llmgw.bench.load import Tally, Timed, level, read_stream


def content(text: str) -> bytes:
    return b"data: " + json.dumps({"choices": [{"delta": {"content": text}}]}).encode() + b"\n"


ROLE = b"data: " + json.dumps({"choices": [{"delta": {"role": "assistant"}}]}).encode() + b"\n"
DONE = b"data: [DONE]\n"


def usage(prompt: int, completion: int) -> bytes:
    body = {"choices": [], "usage": {"prompt_tokens": prompt, "completion_tokens": completion}}
    return b"data: " + json.dumps(body).encode() + b"\n"


class Clock:
    """Reads, in turn, the times it was given: one per content chunk, then one for the stream's end."""

    def __init__(self, *times: float) -> None:
        self._times: Iterator[float] = iter(times)

    def __call__(self) -> float:
        return next(self._times)


async def stream(*lines: bytes) -> AsyncIterator[bytes]:
    for line in lines:
        yield line


async def timed(clock: Clock, *lines: bytes) -> Timed:
    result = await read_stream(stream(*lines), 10.0, clock)
    assert isinstance(result, Timed), result
    return result


class TestOneStream:
    async def test_ttft_is_the_first_content_chunk_not_the_role_chunk_before_it(self):
        # Sent at 10.0; content at 10.25, 10.3, 10.4, 10.6; the stream ends at 10.75.
        one = await timed(
            Clock(10.25, 10.3, 10.4, 10.6, 10.75),
            ROLE, content("a"), content("b"), content("c"), content("d"), usage(650, 4), DONE,
        )  # fmt: skip
        assert one.ttft_s == pytest.approx(0.25)
        assert one.e2e_s == pytest.approx(0.75)

    async def test_itl_is_each_gap_between_content_chunks(self):
        one = await timed(
            Clock(10.25, 10.3, 10.4, 10.6, 10.75),
            content("a"),
            content("b"),
            content("c"),
            content("d"),
            DONE,
        )
        assert one.itl_s == pytest.approx([0.05, 0.1, 0.2])

    async def test_tpot_is_end_to_end_less_ttft_over_the_output_tokens_after_the_first(self):
        # Two chunks, but the engine says it produced 6 tokens: (0.75 - 0.25) / (6 - 1).
        one = await timed(Clock(10.25, 10.5, 10.75), content("ab"), content("cdef"), usage(7, 6), DONE)
        assert one.tpot_s == pytest.approx(0.1)

    async def test_tokens_are_the_engines_usage_not_the_chunks_or_the_words(self):
        one = await timed(Clock(10.1, 10.2, 10.3), content("hello"), content(" world"), usage(650, 5), DONE)
        assert (one.input_tokens, one.output_tokens, one.usage) == (650, 5, True)

    async def test_a_stream_without_usage_counts_its_content_chunks_and_no_input_tokens(self):
        one = await timed(Clock(10.1, 10.2, 10.3), content("a"), content("b"), DONE)
        assert (one.input_tokens, one.output_tokens, one.usage) == (None, 2, False)

    async def test_a_reply_of_one_token_has_a_ttft_but_no_tpot(self):
        one = await timed(Clock(10.5, 10.5), content("a"), usage(3, 1), DONE)
        assert (one.ttft_s, one.tpot_s, one.itl_s) == (pytest.approx(0.5), None, [])

    async def test_an_error_chunk_is_the_gateways_words(self):
        error = b'data: {"error": {"message": "the engine stopped"}}\n'
        said = await read_stream(stream(content("a"), error), 10.0, Clock(10.1))
        assert said == "HTTP 200: the engine stopped"


class TestLevel:
    @staticmethod
    def tally() -> Tally:
        tally = Tally()
        for ttft, itl, e2e, inputs, outputs in (
            (0.1, [0.01, 0.03], 0.5, 100, 5),
            (0.2, [0.02], 0.6, 120, 3),
            (0.3, [], 0.9, 110, 1),
        ):
            tally.add(Timed(ttft, itl, e2e, inputs, outputs, usage=True))
        return tally

    def test_percentiles_of_ttft_tpot_itl_and_end_to_end_are_in_milliseconds(self):
        x = level(4, self.tally(), 2.0, EngineLoad(None, None), 1)
        assert (x.ttft_p50_ms, x.ttft_p99_ms) == (200.0, pytest.approx(298.0))
        # TPOT: (0.5 - 0.1) / 4 and (0.6 - 0.2) / 2; the one-token reply has none.
        assert (x.tpot_p50_ms, x.tpot_p95_ms) == (pytest.approx(150.0), pytest.approx(195.0))
        # ITL over every gap of every request: 10, 20, 30 ms.
        assert (x.itl_p50_ms, x.itl_p95_ms, x.itl_p99_ms) == (20.0, pytest.approx(29.0), pytest.approx(29.8))
        assert (x.e2e_p50_ms, x.e2e_p95_ms) == (600.0, pytest.approx(870.0))

    def test_token_counts_and_throughputs_come_from_the_usage(self):
        x = level(4, self.tally(), 2.0, EngineLoad(None, None), 1)
        assert (x.requests, x.input_tokens, x.output_tokens, x.requests_without_usage) == (3, 330, 9, 0)
        assert (x.requests_per_s, x.output_tokens_per_s, x.total_tokens_per_s) == (1.5, 4.5, 169.5)

    def test_a_level_whose_replies_carried_no_usage_has_no_total_throughput(self):
        tally = Tally()
        tally.add(Timed(0.1, [0.01], 0.2, None, 2, usage=False))
        x = level(1, tally, 1.0, EngineLoad(None, None), 1)
        assert (x.output_tokens_per_s, x.total_tokens_per_s, x.requests_without_usage) == (2.0, None, 1)

    def test_a_level_where_nothing_streamed_has_no_latencies_rather_than_zeros(self):
        tally = Tally()
        tally.fail("HTTP 503: no ready replica")
        x = level(1, tally, 1.0, EngineLoad(None, None), 0)
        assert (x.ttft_p50_ms, x.tpot_p99_ms, x.itl_p50_ms, x.e2e_p95_ms) == (None, None, None, None)
        assert (x.errors, x.error) == (1, "HTTP 503: no ready replica")
