"""What a key allows beyond its type, declared with its field: held when read, said in the reference.

A port of 99999 or a drain timeout of -5 used to be accepted by the loader and
found later, as a traceback after other listeners had started, or never. A
field's Check is applied when the file is structured, so such a value is
refused with the file, line and key before anything listens, and
docs/reference.md prints the same `allowed` text next to the key.
"""

from __future__ import annotations

import difflib
import ipaddress
import math
import re
import urllib.parse
from collections.abc import Callable
from typing import Any

import attrs

from llmgw.config.database import PostgresUrl, is_postgres_url
from llmgw.engines.registry import ENGINES

# A year: longer than any wait llmgw has a use for, and far inside what datetime and asyncio can add.
MAX_SECONDS = 365 * 24 * 3600
# One label of a host name (RFC 1123): letters, digits and inner hyphens.
_LABEL = re.compile(r"(?!-)[A-Za-z0-9-]{1,63}(?<!-)")
# ASCII digits only: int() would also read other scripts' digits.
_PORT = re.compile(r"[0-9]+")


@attrs.frozen
class Check:
    """What a key allows: `allowed` for the reference, `problem` why a value is not (empty: it is).

    each: the key is a list or a mapping, and every item (value) of it is held to the check on its
    own line. keys: the key is a mapping, and each of its keys is held to the check, on its own
    line, before the values are read; the problem then reads after the key (`'engines.tgi' is not
    ...`).
    """

    allowed: str
    problem: Callable[[Any], str]
    each: bool = False
    keys: bool = False

    def __call__(self, value: Any) -> str:
        return self.problem(value)


def number(low: float, *, above: bool = False, high: float | None = None, unit: str = "") -> Check:
    """A whole number or a number of at least low (more than low when above), at most high when given."""
    least = f"more than {_said(low)}" if above else f"{_said(low)} or more"
    allowed = f"{least} and at most {_said(high)}" if high is not None else least
    if unit:
        allowed = f"{allowed} ({unit})"

    def problem(value: Any) -> str:
        if isinstance(value, float) and not math.isfinite(value):
            return f"expected a finite number, {allowed}"
        too_low = value <= low if above else value < low
        if too_low or (high is not None and value > high):
            return f"expected {allowed}"
        return ""

    return Check(allowed, problem)


def _said(value: float) -> str:
    """31,536,000 rather than 3.1536e+07; 0.5 as itself."""
    return f"{int(value):,}" if float(value).is_integer() else f"{value:g}"


def seconds(low: float = 0, *, above: bool = False, high: float = MAX_SECONDS) -> Check:
    """A duration in seconds: finite, and bounded so that no clock arithmetic overflows."""
    return number(low, above=above, high=high, unit="seconds")


def _host_problem(host: str, *, empty_ok: bool) -> str:
    if not host:
        return "" if empty_ok else "it names no host"
    if host.startswith("["):
        try:
            ipaddress.IPv6Address(host[1:-1])
        except ValueError:
            return f"{host[1:-1]} is not an IPv6 address"
        return ""
    if all(part.isdigit() for part in host.split(".")):
        try:
            ipaddress.IPv4Address(host)
        except ValueError:
            return f"{host} is not an IPv4 address"
        return ""
    if len(host) > 253 or not all(_LABEL.fullmatch(label) for label in host.removesuffix(".").split(".")):
        return f"{host!r} is neither an IP address nor a host name"
    return ""


def _address(value: Any, *, lowest_port: int, empty_host_ok: bool, example: str) -> str:
    host, colon, port = str(value).rpartition(":")
    if not colon or not _PORT.fullmatch(port):
        return f"expected host:port, such as {example}"
    if ":" in host and not (host.startswith("[") and host.endswith("]")):
        return f"an IPv6 address goes in brackets, as [{host}]:{port}"
    if not lowest_port <= int(port) <= 65535:
        return f"port {int(port)} is outside {lowest_port}-65535"
    return _host_problem(host, empty_ok=empty_host_ok)


def listen_address(example: str) -> Check:
    """An address llmgw listens on: host:port, port 0 for a free one, an empty host for every address."""
    return Check(
        "host:port; host an IP address, [IPv6], a name or empty (every address); port 0-65535 (0: any free)",
        lambda v: _address(v, lowest_port=0, empty_host_ok=True, example=example),
    )


def optional_listen_address(example: str) -> Check:
    """A listener that is off when empty: otherwise as listen_address."""
    return Check(
        "empty (off), or host:port; host an IP address, [IPv6], a name or empty (every address); "
        "port 0-65535",
        lambda v: "" if v == "" else _address(v, lowest_port=0, empty_host_ok=True, example=example),
    )


def dial_address(example: str) -> Check:
    """Addresses llmgw connects to, one per item of a list: a host and a port 1-65535."""
    return Check(
        "each host:port; host an IP address, [IPv6] or a name; port 1-65535",
        lambda v: _address(v, lowest_port=1, empty_host_ok=False, example=example),
        each=True,
    )


def optional_dial_address(example: str) -> Check:
    """One address llmgw is reached at, or empty for the default: a host and a port 1-65535."""
    return Check(
        "empty, or host:port; host an IP address, [IPv6] or a name; port 1-65535",
        lambda v: "" if v == "" else _address(v, lowest_port=1, empty_host_ok=False, example=example),
    )


def http_url(*, empty_ok: bool) -> Check:
    """The http:// or https:// URL of a server (empty allowed when empty_ok: the key is then unused)."""

    def problem(value: Any) -> str:
        if empty_ok and value == "":
            return ""
        parts = urllib.parse.urlsplit(str(value))
        if parts.scheme not in ("http", "https") or not parts.netloc:
            return "expected an http:// or https:// URL, such as https://mirror.example/engines"
        return ""

    allowed = "an http:// or https:// URL" + (", or empty" if empty_ok else "")
    return Check(allowed, problem)


def _database_problem(value: Any) -> str:
    text = str(value)
    if not is_postgres_url(text):
        return ""
    try:
        PostgresUrl.parse(text)
    except ValueError as exc:
        return str(exc)
    return ""


# database: a PostgreSQL address with no host or database used to be found only at start, as the
# driver's traceback; anything else is the path of an SQLite file, which opening checks.
DATABASE = Check(
    "empty, the path of an SQLite file, or postgresql://USER[:PASSWORD]@HOST[:PORT]/DATABASE",
    _database_problem,
)

_HEX64 = re.compile(r"[0-9a-f]{64}")

# admin_tokens: a token pasted in place of its digest would never match, and the admin API would
# answer 401 to the very script it was meant for.
TOKEN_DIGESTS = Check(
    "each a token's sha256: 64 hexadecimal digits",
    lambda v: (
        ""
        if _HEX64.fullmatch(str(v).strip().lower())
        else "expected a token's sha256 (64 hexadecimal digits), as `llmgw ctl new-token` prints it, "
        "never the token itself"
    ),
    each=True,
)

# auth.oidc.groups: a value such as `teams:ml` or `Admin` gave the person nothing at all, yet let them
# in as a member of a mapped group.
OIDC_GRANTS = Check(
    "each `admin`, `project:PROJECT`, `team:TEAM` or `org:ORG` (by name or id)",
    lambda v: (
        ""
        if v == "admin" or (str(v).split(":")[0] in ("project", "team", "org") and str(v).partition(":")[2])
        else "expected `admin`, `project:PROJECT`, `team:TEAM` or `org:ORG`"
    ),
    each=True,
)

# engine_mirror.checksums: a value in another form was skipped, and the node refused the asset as
# unlisted when it came to install it.
ASSET_DIGESTS = Check(
    "each `sha256:` and 64 hexadecimal digits",
    lambda v: (
        ""
        if str(v).startswith("sha256:") and _HEX64.fullmatch(str(v).removeprefix("sha256:").strip().lower())
        else "expected `sha256:` and 64 hexadecimal digits (`sha256sum FILE` prints them)"
    ),
    each=True,
)


def _engine_kind_problem(name: Any) -> str:
    # Read from the registry when the file is: an engine is one module and one line there, and
    # agent.yaml then takes settings for it with nothing added here.
    if name in ENGINES:
        return ""
    known = ", ".join(sorted(ENGINES))
    near = difflib.get_close_matches(str(name), list(ENGINES), n=1)
    hint = f"; did you mean '{near[0]}'?" if near else ""
    if name == "disabled":
        hint = " (`disabled` is a list of engines: `disabled: [vllm]`, or `vllm: {disabled: true}`)"
    return f"is not an engine llmgw knows; known engines: {known}{hint}"


# agent.yaml's engines: a misspelt engine used to be a key nobody read, and its binary was never run.
ENGINE_KINDS = Check("keys engine kinds: " + ", ".join(ENGINES), _engine_kind_problem, keys=True)


def _wheelhouse_problem(value: Any) -> str:
    text = str(value)
    if not text or text.startswith("/"):
        return ""
    parts = urllib.parse.urlsplit(text)
    if parts.scheme in ("http", "https") and parts.netloc:
        return ""
    # A relative path would be read from whatever directory the agent was started in.
    return "expected an absolute directory (/srv/wheels) or an http:// or https:// URL"


# engines.<kind>.wheelhouse: pip takes both, and a relative one would follow the agent's working directory.
WHEELHOUSE = Check("empty, an absolute directory, or an http:// or https:// URL", _wheelhouse_problem)
