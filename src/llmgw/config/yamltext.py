"""Reading YAML a person wrote: the one function every file, `ctl model add` and the admin API go through.

YAML can say much more than it spells out: nine lines of nested aliases (the
"billion laughs") stand for a billion values, and a model definition of 446
bytes once took 14 s, doubled the server's memory and stalled the gateway
before anything looked at it. So the text's events are counted before it is
built into values, which takes no more memory than the text itself: the
values it would expand to, its aliases and its nesting each have a budget no
real configuration comes near, and text over one is refused with its line,
having built nothing.
"""

from __future__ import annotations

import io
from typing import Any

from ruamel.yaml import YAML
from ruamel.yaml.constructor import RoundTripConstructor
from ruamel.yaml.error import MarkedYAMLError, YAMLError
from ruamel.yaml.events import (
    AliasEvent,
    CollectionEndEvent,
    CollectionStartEvent,
    Event,
    NodeEvent,
    ScalarEvent,
)

from llmgw.errors import ConfigError

# The largest text read: a catalog of a thousand models fits in a quarter of it.
MAX_BYTES = 1024 * 1024
# Aliases are for sharing a profile between a few models; more than this is not a configuration.
MAX_ALIASES = 32
# Values once aliases are expanded: a thousand models of twenty keys each is a fifth of it.
MAX_VALUES = 100_000
# Characters in an unquoted number: far more than any count or duration, far fewer than Python's limit.
MAX_NUMBER = 100
# llmgw's deepest key is five levels down; past this, building the values would exhaust Python's stack.
MAX_DEPTH = 32


def read_yaml(text: str, source: str) -> Any:
    """The values text says (None when it says nothing), with the lines of its keys; ConfigError when refused.

    The values are ruamel.yaml's round-trip ones, which config.line_of reads lines from.
    """
    size = len(text.encode("utf-8", "surrogatepass"))
    if size > MAX_BYTES:
        raise ConfigError(f"{source}: is {size:,} bytes; llmgw reads at most {MAX_BYTES:,} bytes of YAML")
    yaml = YAML(typ="rt")
    yaml.Constructor = _JoiningConstructor
    try:
        _within_budget(yaml.parse(io.StringIO(text)), source)
        return yaml.load(io.StringIO(text))
    except MarkedYAMLError as exc:
        mark = exc.problem_mark
        line = mark.line + 1 if mark is not None else "?"
        raise ConfigError(f"{source}:{line}: not valid YAML: {exc.problem}") from None
    except YAMLError as exc:
        # A character YAML does not allow (a NUL, a control character) is found before any line is.
        raise ConfigError(f"{source}: not valid YAML: {' '.join(str(exc).split())}") from None


def _within_budget(events: Any, source: str) -> None:
    """Count what the text would build, and refuse it at the first event over a budget."""
    # Values each anchored node stands for, so that an alias counts what it repeats.
    sizes: dict[str, int] = {}
    # The collections open around the current event, each with the values it holds so far.
    open_sizes: list[int] = []
    open_anchors: list[str | None] = []
    aliases = 0
    for event in events:
        if isinstance(event, NodeEvent) and not isinstance(event, AliasEvent):
            _tag_allowed(event, source)
        if isinstance(event, CollectionStartEvent):
            if len(open_sizes) >= MAX_DEPTH:
                raise _refused(event, source, f"nests deeper than {MAX_DEPTH} levels")
            open_sizes.append(1)
            open_anchors.append(event.anchor)
            continue
        if isinstance(event, AliasEvent):
            aliases += 1
            if aliases > MAX_ALIASES:
                raise _refused(
                    event, source, f"uses more than {MAX_ALIASES} aliases (*name); write the values out"
                )
            size = sizes.get(event.anchor, 1)
        elif isinstance(event, ScalarEvent):
            _scalar_allowed(event, source)
            size = 1
            if event.anchor:
                sizes[event.anchor] = 1
        elif isinstance(event, CollectionEndEvent):
            size = open_sizes.pop()
            anchor = open_anchors.pop()
            if anchor:
                sizes[anchor] = size
        else:
            continue  # the stream's and documents' own events
        if open_sizes:
            open_sizes[-1] += size
        # A collection holds at least what its open ones hold, so checking the innermost is enough.
        if (open_sizes[-1] if open_sizes else size) > MAX_VALUES:
            raise _refused(
                event,
                source,
                f"expands to more than {MAX_VALUES:,} values through its aliases (*name); "
                "write the values out",
            )


def _scalar_allowed(event: ScalarEvent, source: str) -> None:
    value = event.value
    # Python refuses to read an integer of more than 4,300 digits, with a ValueError that would
    # otherwise end in a traceback; no key of llmgw's wants one.
    if not event.style and len(value) > MAX_NUMBER and value[:1] in "+-.0123456789":
        raise _refused(event, source, f"has a number of {len(value):,} characters; quote it if it is text")
    try:
        _joined(value).encode("utf-8")
    except UnicodeEncodeError:
        # "\ud800" in double quotes: half a character, which the store, logs and replies cannot write.
        raise _refused(event, source, "has an escape (\\uD800-\\uDFFF) that is half a character") from None


def _joined(value: str) -> str:
    """value with each escaped surrogate pair as the one character it is.

    "\ud83d\ude00" is how json.dumps writes an emoji (JSON is YAML); ruamel.yaml reads it as two
    halves, and the definition was refused as "half a character". A half left alone stays a half.
    """
    if not any("\ud800" <= ch <= "\udfff" for ch in value):
        return value
    return value.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "surrogatepass")


class _JoiningConstructor(RoundTripConstructor):
    """ruamel.yaml's round-trip constructor, building each string with its surrogate pairs joined."""

    def construct_scalar(self, node: Any) -> Any:
        if isinstance(node.value, str):
            node.value = _joined(node.value)
        return super().construct_scalar(node)


def _tag_allowed(event: NodeEvent, source: str) -> None:
    # A tag (`!!python/object:os.system`, `!foo`, even `!!str`) keeps its value from being a plain
    # string, number or list, which is all a key of llmgw's holds; quotes say "text" without one.
    tag = getattr(event, "tag", None)
    if tag is not None:
        raise _refused(event, source, f"has the tag {tag}; write the plain value (in quotes for text)")


def _refused(event: Event, source: str, why: str) -> ConfigError:
    mark = event.start_mark
    line = f":{mark.line + 1}" if mark is not None else ""
    return ConfigError(f"{source}{line}: {why}")
