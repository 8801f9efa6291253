"""Reading a configuration file: ruamel.yaml in, cattrs to structure, one ConfigError out.

A file that cannot be used is refused at start with the file, the line, the key
and what was expected, because an operator who learns about a typo only when a
request fails has lost an hour. cattrs walks the classes and collects every
fault with the key path in its notes; this module only makes scalars strict
(cattrs would read `enabled: "no"` as true) and turns the first fault in the
file into a sentence.
"""

from __future__ import annotations

import difflib
import io
import typing
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, Literal, TypeVar

import attrs
import cattrs
from cattrs.errors import (
    BaseValidationError,
    ClassValidationError,
    ForbiddenExtraKeysError,
    IterableValidationError,
)
from cattrs.gen import make_dict_structure_fn, override
from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap

from llmgw.config.checks import Check
from llmgw.config.location import dotted, line_of, where
from llmgw.config.yamltext import read_yaml
from llmgw.errors import ConfigError

T = TypeVar("T")


def parse(cls: type[T], text: str, source: str = "<string>") -> T:
    """Structure YAML text into cls, or raise ConfigError naming source, line and key."""
    data = read_yaml(text, source)
    if data is None:
        data = CommentedMap()
    try:
        result = _converter.structure(_plain(data, []), cls)
    except _NotText as exc:
        raise ConfigError(exc.say(source, data)) from None
    except (BaseValidationError, _Refused) as exc:
        raise ConfigError(_first_fault(exc, source, data)) from None
    # Checks of several keys together, after each key's own: a class that has some says them here.
    across = getattr(result, "problem_across_keys", None)
    if across is not None and (found := across()) is not None:
        keys, why = found
        # At the line of a key the file sets; the other may be its default.
        said = [key for key in keys if line_of(data, [key]) is not None] or keys
        raise ConfigError(f"{where(source, data, [said[-1]])}: {why}")
    return result


def load(cls: type[T], path: Path) -> T:
    """Read and structure a configuration file."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{path}: cannot be read: {exc.strerror}") from None
    return parse(cls, text, str(path))


def check_flag(cls: type, key: str, value: Any, flag: str) -> None:
    """ConfigError when value, given with flag in place of cls's key, is not what the key allows.

    A flag that overrides a key is held to the key's own check, so that `--listen 127.0.0.1:99999`
    is refused before anything listens, as the same value in the file would be.
    """
    check = attrs.fields_dict(cls)[key].metadata.get("check")
    if check is not None and (problem := check(value)):
        raise ConfigError(f"{flag} is {_shown(value)}; {problem}")


def dump(value: Any) -> str:
    """YAML text for a configuration object, as `llmgw` itself would write it."""
    yaml = YAML(typ="safe")
    yaml.default_flow_style = False
    out = io.StringIO()
    yaml.dump(_converter.unstructure(value), out)
    return out.getvalue()


def evolve(value: T, **changes: Any) -> T:
    """A copy of a configuration object with some keys changed."""
    return attrs.evolve(value, **changes)  # type: ignore[misc]


def type_name(tp: Any) -> str:
    """What a value of tp is called in an error: "a whole number", "a list of a mapping"."""
    origin = typing.get_origin(tp)
    if origin is list:
        return f"a list of {type_name(typing.get_args(tp)[0])}"
    if origin is dict or attrs.has(tp):
        return "a mapping"
    if origin is Literal:
        return f"one of {', '.join(str(c) for c in typing.get_args(tp))}"
    return _SCALARS.get(tp, str(tp))


_SCALARS: dict[Any, str] = {str: "a string", int: "a whole number", float: "a number", bool: "true or false"}


def unwrap_optional(tp: Any) -> Any:
    """X for `X | None` (absent is None); tp itself for any other type."""
    args = [a for a in typing.get_args(tp) if a is not type(None)]
    if type(None) in typing.get_args(tp) and len(args) == 1:
        return args[0]
    return tp


class _Refused(ValueError):
    """A value of the wrong kind; the key is added by whoever knows the path."""

    def __init__(self, value: Any, expected: str, at: list[str | int] | None = None) -> None:
        super().__init__(value, expected)
        self.value = value
        self.expected = expected
        # Where below the field the value is: the item of a list whose items are checked one by one.
        self.at = at or []

    def say(self, key: str) -> str:
        if self.value is None:
            return f"'{key}' is empty; expected {self.expected}"
        return f"'{key}' is {_shown(self.value)}; expected {self.expected}"


class _Unusable(_Refused):
    """A value of the right kind that a field's own check refuses, saying why."""

    def say(self, key: str) -> str:
        return f"'{key}' is {_shown(self.value)}; {self.expected}"


class _UnknownName(_Refused):
    """A key of a mapping whose keys are names of something (engine kinds) that names none."""

    def say(self, key: str) -> str:
        return f"'{key}' {self.expected}"


class _NotAMapping(_Refused):
    def say(self, key: str) -> str:
        return f"{key or 'the file'} must be a mapping"


def _first_fault(exc: BaseException, source: str, root: Any) -> str:
    """The fault earliest in the file, as `server.yaml:4: 'models[0].replicas' is 'two'; ...`."""
    # Earliest line first, as an operator reads the file; one the file has no line for (the file
    # itself) last.
    path, fault = min(_faults(exc, []), key=lambda f: line_of(root, f[0]) or float("inf"))
    located, key = where(source, root, path), dotted(path)
    if isinstance(fault, ForbiddenExtraKeysError):
        names = [f.name for f in attrs.fields(fault.cl)]
        near = difflib.get_close_matches(str(path[-1]), names, n=1)
        hint = f"; did you mean '{near[0]}'?" if near else f"; known keys: {', '.join(names)}"
        return f"{located}: unknown key '{key}'{hint}"
    if isinstance(fault, _Refused):
        return f"{located}: {fault.say(key)}"
    return f"{located}: '{key}' could not be read: {fault}"


def _faults(exc: BaseException, path: list[str | int]) -> Iterator[tuple[list[str | int], BaseException]]:
    """Every leaf fault of a cattrs error with its key path, read from cattrs' validation notes."""
    steps: list[tuple[Exception, str | int]] = []
    others: list[Exception] = []
    if isinstance(exc, ClassValidationError):
        attributes, others = exc.group_exceptions()
        steps = [(inner, note.name) for inner, note in attributes]
    elif isinstance(exc, IterableValidationError):
        items, others = exc.group_exceptions()
        steps = [(inner, note.index) for inner, note in items]
    if isinstance(exc, BaseValidationError):
        for inner, step in steps:
            yield from _faults(inner, [*path, step])
        for inner in others:
            yield from _faults(inner, path)
    elif isinstance(exc, ForbiddenExtraKeysError):
        for key in sorted(exc.extra_fields):
            yield [*path, key], exc
    else:
        yield [*path, *getattr(exc, "at", [])], exc


class _NotText(ValueError):
    """A mapping key that is not text: `? [a, b]`, `null:`, `true:`; never turned into a string."""

    def __init__(self, path: list[str | int], key: Any) -> None:
        super().__init__(path, key)
        self.path = path
        self.key = key

    def say(self, source: str, root: Any) -> str:
        under = f"a key under '{dotted(self.path)}'" if self.path else "a key"
        return f"{where(source, root, self.path)}: {under} is {_shown(self.key)}; keys are names (text)"


def _plain(node: Any, path: list[str | int]) -> Any:
    if isinstance(node, dict):
        plain = {}
        for k, v in node.items():
            # A number is a name YAML read as a number (`0: gpu`); anything else would become its repr.
            if not isinstance(k, str) and (isinstance(k, bool) or not isinstance(k, (int, float))):
                raise _NotText(path, k)
            plain[str(k)] = _plain(v, [*path, str(k)])
        return plain
    if isinstance(node, list):
        return [_plain(v, [*path, i]) for i, v in enumerate(node)]
    return node


def _shown(value: Any) -> str:
    """value as an error shows it: short, because a whole mapping quoted back buries the sentence."""
    text = repr(value)
    return text if len(text) <= _SHOWN else f"{text[: _SHOWN - 4]} ..."


_SHOWN = 80


_converter = cattrs.Converter(forbid_extra_keys=True, detailed_validation=True)


def _strict(tp: type, accepts: Callable[[Any], bool]) -> Callable[[Any, Any], Any]:
    def structure(value: Any, _: Any) -> Any:
        if not accepts(value):
            raise _Refused(value, type_name(tp))
        return tp(value)

    return structure


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


_converter.register_structure_hook(str, _strict(str, lambda v: isinstance(v, str)))
_converter.register_structure_hook(bool, _strict(bool, lambda v: isinstance(v, bool)))
_converter.register_structure_hook(int, _strict(int, lambda v: _is_number(v) and not isinstance(v, float)))
_converter.register_structure_hook(float, _strict(float, _is_number))


def _literal(value: Any, tp: Any) -> Any:
    if value not in typing.get_args(tp):
        raise _Refused(value, type_name(tp))
    return value


def _is_literal(tp: Any) -> bool:
    origin: Any = typing.get_origin(tp)
    return origin is Literal


_converter.register_structure_hook_func(_is_literal, _literal)


def _as_text(value: Any) -> Any:
    # `args: [--ctx, 4096]` and `env: {CUDA_VISIBLE_DEVICES: 0}` mean text; YAML reads numbers.
    return str(value) if isinstance(value, (int, float)) else value


def _field_hook(
    tp: Any, check: Check | None, older: Callable[[Any], Any] | None = None
) -> Callable[[Any, Any], Any]:
    """How one field is structured: an older shape read as today's, absent said out loud, the
    container's kind, its keys' check, cattrs, its own check."""
    optional = type(None) in typing.get_args(tp)
    inner = unwrap_optional(tp)
    origin = typing.get_origin(inner)
    texts = origin in (list, dict) and typing.get_args(inner)[-1:] == (str,)

    def structure(value: Any, _: Any) -> Any:
        if older is not None:
            value = older(value)
        if value is None:
            if optional:
                return None  # `pricing: null`, as `dump` writes it
            raise _Refused(None, type_name(inner))
        if origin in (list, dict) and not isinstance(value, origin):
            raise _Refused(value, type_name(inner))
        if check is not None and check.keys:
            for name in value:
                if problem := check(name):
                    raise _UnknownName(name, problem, at=[name])
        if texts and origin is list:
            value = [_as_text(v) for v in value]
        elif texts:
            value = {k: _as_text(v) for k, v in value.items()}
        result = _converter.structure(value, inner)
        if check is not None and check.each:
            items = result.items() if isinstance(result, dict) else enumerate(result)
            for at, item in items:
                if problem := check(item):
                    raise _Unusable(item, problem, at=[at])
        elif check is not None and not check.keys and (problem := check(result)):
            raise _Unusable(result, problem)
        return result

    return structure


def _class_hook(cls: type) -> Callable[[Any, Any], Any]:
    hints = typing.get_type_hints(cls)
    fields: dict[str, Any] = {
        f.name: override(
            struct_hook=_field_hook(hints[f.name], f.metadata.get("check"), f.metadata.get("older"))
        )
        for f in attrs.fields(cls)
    }
    structure_fields: Callable[[Any, Any], Any] = make_dict_structure_fn(cls, _converter, **fields)

    def structure(value: Any, _: Any) -> Any:
        if not isinstance(value, Mapping):
            raise _NotAMapping(value, "a mapping")
        return structure_fields(value, cls)

    return structure


_converter.register_structure_hook_factory(attrs.has, _class_hook)
