"""Reading what `ldd` could not satisfy, in a person's words.

ldd says it in two shapes:

    libgomp.so.1 => not found
    /lib64/libstdc++.so.6: version `GLIBCXX_3.4.30' not found (required by /x/libllama.so)

The second is a system too old for the build (RHEL 9 against a build that
wants GCC 12's libstdc++). Said as "not found" it would send somebody looking
for a package that is plainly installed, so it is said as "too old".
"""

from __future__ import annotations

import re

_TOO_OLD = re.compile(r"^(?P<lib>\S+?):\s+version\s+[`'‘](?P<symbol>[^'’`]+)['’`]\s+not found")
_MISSING = re.compile(r"^(?P<lib>\S+)\s+=>\s+not found")


def unmet(output: str) -> list[str]:
    """Each library the binary cannot load, once, in the order ldd first names it."""
    found: list[str] = []
    for raw in output.splitlines():
        line = raw.strip()
        if (m := _TOO_OLD.match(line)) is not None:
            lib = m.group("lib").rsplit("/", 1)[-1]
            what = f"{lib} is too old (needs {m.group('symbol')})"
        elif (m := _MISSING.match(line)) is not None:
            what = f"{m.group('lib')} is not installed"
        else:
            continue
        if what not in found:
            found.append(what)
    return found
