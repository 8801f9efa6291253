"""Which agent versions a control plane takes: one minor version either side of its own.

An upgrade without downtime runs a fleet of mixed versions for a while: the
servers first, then the agents node by node. Within the window both ends
understand each other's messages; outside it an agent would be read wrongly
without anyone noticing, so it is refused in words that say which end to
upgrade (docs/operations.md, "Versions"). With a 0.x version the minor is the
middle number: server 0.11 takes agents 0.10 to 0.12. Another major is outside.
"""

from __future__ import annotations

import re

from llmgw.stream_words import VERSION_WINDOW

# The leading "major.minor" of a version: "0.11.2", "0.11.0rc1", "0.11.dev3+g1234".
_MAJOR_MINOR = re.compile(r"^v?(\d+)\.(\d+)")


def major_minor(version: str) -> tuple[int, int] | None:
    """(major, minor) of version; None when it is empty or not a release number ("dev")."""
    match = _MAJOR_MINOR.match(version.strip())
    return (int(match[1]), int(match[2])) if match else None


def window(server_version: str) -> str:
    """The agent versions server_version takes, as a person reads them: "0.10–0.12"."""
    server = major_minor(server_version)
    if server is None:
        return "any"
    major, minor = server
    return f"{major}.{max(minor - 1, 0)}–{major}.{minor + 1}"


def refusal(agent_version: str, server_version: str) -> str | None:
    """Why a control plane of server_version refuses an agent of agent_version; None when it takes it.

    An agent that does not say its version (every agent before the window existed) or says one that
    is no release number is taken: the caller warns, since refusing would strand a fleet mid-upgrade.
    """
    agent, server = major_minor(agent_version), major_minor(server_version)
    if agent is None or server is None:
        return None
    if agent[0] == server[0] and abs(agent[1] - server[1]) <= 1:
        return None
    if agent < server:
        return (
            f"agent {agent_version} is older {VERSION_WINDOW} ({window(server_version)}): "
            "upgrade it (docs/operations.md, Versions)"
        )
    return (
        f"agent {agent_version} is newer {VERSION_WINDOW} ({window(server_version)}): "
        "upgrade the server first"
    )
