"""An engine's failure in one line: the line of its last output that names the error, as a person reads it."""

from __future__ import annotations

from llmgw.engines.base import last_words
from llmgw.engines.llamacpp import LlamaCppEngine
from llmgw.engines.sim import SimEngine

SIM = SimEngine()


class TestLastWords:
    def test_the_first_line_naming_an_error_is_the_cause_not_the_goodbye_after_it(self) -> None:
        output = ["loaded 3 tensors", "error loading model: bad magic", "exiting due to model loading error"]
        assert last_words(SIM, output) == "error loading model: bad magic"

    def test_a_tracebacks_code_lines_are_skipped_for_its_exception(self) -> None:
        output = [
            "Traceback (most recent call last):",
            '  File "server.py", line 3, in <module>',
            "    raise RuntimeError('no GPU')",
            "RuntimeError: CUDA error: no CUDA-capable device is detected",
        ]
        assert last_words(SIM, output) == "RuntimeError: CUDA error: no CUDA-capable device is detected"

    def test_without_an_error_line_it_is_the_last_line_or_nothing_when_only_errors_count(self) -> None:
        assert last_words(SIM, ["starting", "listening", ""]) == "listening"
        assert last_words(SIM, ["starting", "listening"], only_errors=True) == ""
        assert last_words(SIM, []) == ""

    def test_llama_cpps_error_level_marks_its_lines_and_its_prefix_is_dropped(self) -> None:
        output = [
            "0.00.024.035 I srv  llama_server: initializing ...",
            "0.00.055.743 I srv    load_model: loading model '/w/broken.gguf'",
            "0.00.055.916 E gguf_init_from_reader: invalid magic characters: 'not ', expected 'GGUF'",
            "0.00.056.022 E llama_model_load: error loading model: failed to load model from /w/broken.gguf",
            "0.00.066.428 E srv  llama_server: exiting due to model loading error",
        ]
        assert (
            last_words(LlamaCppEngine(), output)
            == "gguf_init_from_reader: invalid magic characters: 'not ', expected 'GGUF'"
        )

    def test_a_huge_line_is_cut(self) -> None:
        assert len(last_words(SIM, ["error: " + "x" * 5000])) == 300

    def test_for_llama_cpp_the_level_decides_not_the_words(self) -> None:
        output = [
            "0.00.010.000 I srv  load_model: no error in the header",
            "0.00.020.000 E llama_model_load: tensor 'output.weight' is missing",
        ]
        assert last_words(LlamaCppEngine(), output) == "llama_model_load: tensor 'output.weight' is missing"
