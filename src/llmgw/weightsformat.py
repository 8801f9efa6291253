"""Which format a model's weights are in, and whether each of its profiles' engines loads it.

A Hugging Face directory given to llama.cpp was accepted by `llmgw ctl model
add`, and then every replica failed on every node with "llama.cpp loads one
GGUF file, and the model's weights hold 0 (none)". The format is known from
the files' names before anything is placed: a source naming a file, a
directory on this machine, the files the mirror holds. Each engine module
declares the formats it loads (`weights_formats`); this says, in one sentence,
which engines serve the format the model has and what the others would need.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import PurePosixPath

from llmgw.config import ModelConfig
from llmgw.engines.registry import ENGINES

GGUF = "gguf"
SAFETENSORS = "safetensors"

# What a person calls each format, and what an engine that loads only it wants to be given.
_WORDS = {GGUF: "a GGUF file", SAFETENSORS: "a Hugging Face safetensors directory"}
# The engines' names as their projects write them.
_TITLES = {"llamacpp": "llama.cpp", "vllm": "vLLM", "sglang": "SGLang"}


def format_of(names: Iterable[str]) -> str | None:
    """The format of weights made of the files names (paths relative to the source); None when unknown.

    GGUF wins over a config.json beside it: a repository holding GGUF files is served from one of them.
    """
    names = list(names)
    if any(n.lower().endswith(".gguf") for n in names):
        return GGUF
    if any(n.lower().endswith(".safetensors") or PurePosixPath(n).name == "config.json" for n in names):
        return SAFETENSORS
    return None


def format_of_name(path: str) -> str | None:
    """The format of a source that names one file (a URL or a path), by its name; None for a directory."""
    if path.endswith("/"):
        return None
    return format_of([path])


def serving(fmt: str) -> list[str]:
    """The engines that load weights in fmt, in the registry's order (sim, which loads none, left out)."""
    return [name for name, e in ENGINES.items() if e.weights_formats is not None and fmt in e.weights_formats]


def engine_problem(model: ModelConfig, fmt: str) -> tuple[int, str] | None:
    """(index of the first profile whose engine does not load fmt, and the sentence); None when all do."""
    for i, profile in enumerate(model.profiles):
        engine = ENGINES.get(profile.engine)
        wanted = engine.weights_formats if engine is not None else None
        if wanted is None or fmt in wanted:
            continue
        return i, (
            f"profile {profile.name!r} runs {profile.engine}, which does not load {_WORDS[fmt]} "
            f"({model.source}); {_advice(fmt, profile.engine, sorted(wanted))}"
        )
    return None


def _advice(fmt: str, engine: str, wanted: Sequence[str]) -> str:
    """ "a Hugging Face safetensors directory: serve it with vllm or sglang; for llama.cpp, a GGUF file"."""
    others = serving(fmt)
    serve = f"serve it with {' or '.join(others)}" if others else "no engine of this release loads it"
    needs = " or ".join(_WORDS[w] for w in wanted)
    return f"{_WORDS[fmt]}: {serve}; for {_TITLES.get(engine, engine)}, {needs}"
