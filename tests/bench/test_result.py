"""A run's words, shared by `ctl bench` and the models page, and runs kept before the figures they lack."""

from __future__ import annotations

import json
from pathlib import Path

import attrs
import pytest

from llmgw.adminapi.bench import read_runs
from llmgw.bench.result import Level, Run, describe, percent

LEVEL = Level(
    concurrency=1, requests=4, errors=0, error="", seconds=2.0, output_tokens=512, ttft_p50_ms=40.0,
    ttft_p95_ms=50.0, itl_p50_ms=5.0, output_tokens_per_s=256.0, requests_per_s=2.0,
    queue_depth_max=None, kv_cache_max=0.0006, engine_readings=3, input_tokens=2600,
)  # fmt: skip
RUN = Run(
    model="tiny", started_at="2026-12-01T00:00:00+00:00", prompt_tokens=128, max_tokens=128, seconds=2.0,
    levels=[LEVEL], engines=["vllm"], served_by=["tiny"],
)  # fmt: skip


class TestPercent:
    @pytest.mark.parametrize(
        ("fraction", "said"),
        [(0.0006, "0.06%"), (0.25, "25%"), (0.12345, "12.3%"), (1.0, "100%"), (0.0, "0%"), (1e-9, "<0.001%")],
    )
    def test_a_cache_occupancy_keeps_the_precision_the_engine_gave_it(self, fraction: float, said: str):
        """A 1 GiB cache at 0.0006 read "0%", as if nothing were cached."""
        assert percent(fraction) == said

    def test_an_occupancy_not_reported_stays_none(self):
        assert percent(None) is None


class TestDescribe:
    def test_the_prompt_is_words_and_the_engine_says_how_many_tokens_they_made(self):
        assert describe(RUN) == (
            "128-word prompts (650 input tokens each), max_tokens 128 (128 output tokens each), 2 s per level"
        )

    def test_a_run_served_by_a_fallback_says_which(self):
        assert describe(attrs.evolve(RUN, served_by=["tiny-q4"])).endswith(
            "2 s per level, served by its fallback tiny-q4"
        )

    def test_replies_without_usage_leave_the_input_tokens_not_reported(self):
        run = attrs.evolve(RUN, levels=[attrs.evolve(LEVEL, input_tokens=0, requests_without_usage=4)])
        assert describe(run).startswith("128-word prompts (input tokens not reported), ")


class TestKeptRuns:
    def test_a_run_kept_before_tpot_and_usage_reads_back_with_those_figures_null(self, tmp_path: Path):
        """The JSON of a run kept by an earlier llmgw: none of the later fields."""
        level = {
            "concurrency": 4, "requests": 10, "errors": 0, "error": "", "seconds": 2.0, "output_tokens": 40,
            "ttft_p50_ms": 40.0, "ttft_p95_ms": 80.0, "itl_p50_ms": 5.0, "output_tokens_per_s": 20.0,
            "requests_per_s": 5.0, "queue_depth_max": None, "kv_cache_max": 0.5, "engine_readings": 2,
        }  # fmt: skip
        old = {
            "model": "tiny", "started_at": "2025-06-01T12:00:00Z", "prompt_tokens": 32, "max_tokens": 16,
            "seconds": 2.0, "levels": [level], "engines": ["llamacpp"],
        }  # fmt: skip
        (tmp_path / "2025-06-01T120000Z-1-0.json").write_text(json.dumps(old))
        (run,) = read_runs(tmp_path)
        (kept,) = run.levels
        assert (kept.ttft_p95_ms, kept.itl_p50_ms, kept.kv_cache_max) == (80.0, 5.0, 0.5)
        assert (kept.input_tokens, kept.tpot_p50_ms, kept.e2e_p99_ms, kept.total_tokens_per_s) == (
            None,
            None,
            None,
            None,
        )
        assert run.served_by == []
        assert describe(run) == (
            "32-word prompts (input tokens not reported), max_tokens 16 (4 output tokens each), 2 s per level"
        )
