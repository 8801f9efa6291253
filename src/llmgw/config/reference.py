"""docs/reference.md, generated from the declarations in classes.py (`make docs`).

A key's help and default live on its field and nowhere else; the prose around
the tables is here. tests/test_config.py fails when the committed file differs
from `render()`, so the reference cannot drift from what `llmgw` reads.
"""

from __future__ import annotations

import typing
from typing import Any, Literal

import attrs

from llmgw.config.classes import AgentConfig, MirrorConfig, ServerConfig
from llmgw.config.loading import unwrap_optional

_INTRO = """\
# Configuration reference

<!-- Generated from src/llmgw/config/classes.py by `make docs`; edit the fields' help there. -->

Every key of every configuration file. A file is checked when `llmgw` starts:
a key it does not know is refused with the nearest known one (`server.yaml:2: unknown key
'auth.enabeld'; did you mean 'enabled'?`), a value of the wrong kind with the file, line,
key and what was expected. `llmgw` then exits with code 78 and starts nothing.

Each role reads its own file: `llmgw --role=server --config /etc/llmgw/server.yaml`.
With several roles in one process, give one `--config` per `--role`, in the same order.
`--dev` writes and reads `server.yaml`, `agent.yaml` and `mirror.yaml` in its directory
(default `./.llmgw-dev`); edit them there and the next `--dev` run uses them.

Addresses are `host:port`; port 0 asks for a free port. Durations end in `_s` and are seconds.
What a key allows beyond its type (a range, the form of an address) follows its type in the tables;
a value outside it is refused in the same way, before anything listens.
A number in a list or mapping of strings is read as its text (`args: [--ctx, 4096]`); a list or
a mapping where text is expected, and a key that is not a name (`null:`, `true:`, `? [a, b]`),
are refused with their line.

Every YAML llmgw reads (these files, `llmgw ctl model add`, the admin API's `POST /api/v1/models`)
is held to the same budget before it is read: at most 1 MiB of text, 32 aliases (`*name`), 100,000
values once its aliases are expanded and 32 levels of nesting, no unquoted number longer than 100
characters, no `\\uD800`-`\\uDFFF` escape (half a character) and no tags (`!!python/object`,
`!vault`; write plain values, text in quotes). YAML over it is refused with its line, having built
nothing, so a few lines of nested aliases cannot stand for a billion values.
"""

_SERVER_EXAMPLES = """\
A model in the catalog:

```yaml
models:
  - name: sim-chat
    replicas: 1
    profiles:
      - engine: sim
        args: ["--ttft-ms", "20"]
```

A model that needs two H100s on one node, or 8 on each of two nodes sharing a fabric, with a CPU
profile to fall back on (docs/placement.md):

```yaml
control:
  placement: spread     # or binpack
engines:
  llamacpp: b11434      # the default; "" removes it
models:
  - name: llama-70b
    replicas: 2
    source: https://mirror.example/llama-70b-q4_k_m.gguf
    profiles:
      - {name: h100, engine: llamacpp, gpu_class: h100-80g, gpus_per_node: 2, labels: {zone: eu}}
      - {name: h100x16, engine: vllm, gpu_class: h100-80g, gpus_per_node: 8, nodes: 2}
      - {name: cpu, engine: llamacpp, min_memory_mb: 65536}
```

Prices, which budgets (docs/gateway.md) are counted in:

```yaml
pricing:
  sim-chat: {prompt_per_1k: 0.5, completion_per_1k: 1.5}
default_price: {prompt_per_1k: 1.0, completion_per_1k: 2.0}
```
"""

# (file, what it configures, class, prose after its table)
_FILES: list[tuple[str, str, type, str]] = [
    (
        "server.yaml",
        "The gateway, the admin listener, the agent service, the store and the model catalog.",
        ServerConfig,
        _SERVER_EXAMPLES,
    ),
    (
        "agent.yaml",
        "A node: which control plane to dial, with which certificate, and how to run engines.",
        AgentConfig,
        "",
    ),
    ("mirror.yaml", "The file mirror.", MirrorConfig, ""),
]


_HEADER = "| key | type | default | meaning |\n| --- | --- | --- | --- |\n"


def render() -> str:
    """The text of docs/reference.md."""
    parts = [_INTRO]
    for name, about, cls, after in _FILES:
        table = "\n".join(
            f"| `{key}` | {kind} | {default} | {help} |" for key, kind, default, help in _rows(cls, "")
        )
        parts.append(f"## {name}\n\n{about}\n\n{_HEADER}{table}\n")
        if after:
            parts.append(after)
    return "\n".join(parts)


def documented_keys(cls: type, prefix: str = "") -> list[tuple[str, str]]:
    """Every dotted key of cls with its help text, for docs/reference.md and its test."""
    return [(key, help) for key, _, _, help in _rows(cls, prefix)]


def _rows(cls: type, prefix: str) -> list[tuple[str, str, str, str]]:
    """(dotted key, type, default, help) of every key of cls, sections before their keys."""
    rows: list[tuple[str, str, str, str]] = []
    hints = typing.get_type_hints(cls)
    defaults = cls()  # every key has a default
    for f in attrs.fields(cls):
        key = f"{prefix}{f.name}"
        tp = hints[f.name]
        help = f.metadata.get("help", "").replace("|", "\\|")  # a bare | would end the table's cell
        check = f.metadata.get("check")
        kind = f"{_kind(tp)}: {check.allowed}" if check is not None else _kind(tp)
        rows.append((key, kind.replace("|", "\\|"), _shown(getattr(defaults, f.name)), help))
        inner = unwrap_optional(tp)
        args = typing.get_args(inner)
        if attrs.has(inner):
            rows.extend(_rows(inner, f"{key}."))
        elif typing.get_origin(inner) is list and attrs.has(args[0]):
            rows.extend(_rows(args[0], f"{key}[]."))
        elif typing.get_origin(inner) is dict and attrs.has(args[1]):
            rows.extend(_rows(args[1], f"{key}.<name>."))
    return rows


def _kind(tp: Any) -> str:
    """What a key holds, in the reference's words."""
    inner = unwrap_optional(tp)
    if inner is not tp:
        return f"{_kind(inner)} or null"
    args = typing.get_args(tp)
    origin = typing.get_origin(tp)
    if origin is Literal:
        return " or ".join(f"`{a}`" for a in args)
    if origin is list:
        return "list of sections" if attrs.has(args[0]) else f"list of {_kind(args[0])}s"
    if origin is dict:
        return "mapping of sections" if attrs.has(args[1]) else f"mapping of {_kind(args[1])}s"
    if attrs.has(tp):
        return "section"
    return {str: "string", int: "whole number", float: "number", bool: "true or false"}[tp]


def _shown(default: Any) -> str:
    if attrs.has(type(default)):
        return "—"  # its keys, below, have the defaults
    if default is None:
        return "none"
    if default == "":
        return "empty"
    if isinstance(default, bool):
        return f"`{str(default).lower()}`"
    if isinstance(default, list):
        return f"`[{', '.join(str(v) for v in default)}]`"
    if isinstance(default, dict):
        return "`{" + ", ".join(f"{k}: {v}" for k, v in default.items()) + "}`"
    return f"`{default}`"
