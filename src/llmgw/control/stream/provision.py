"""Which engines every node should have, at which versions: the Provision the control plane sends.

The control plane names engines and versions and nothing else; which build
fits a node's processor and driver is the node's to work out
(agent/provision). The message goes down every stream right after its Ack,
on every registration, so a node that was rebuilt from nothing, or whose
agent restarted, converges without anyone asking it to.
"""

from __future__ import annotations

from collections.abc import Mapping

from llmgw.config import EngineMirrorConfig
from llmgw.engines.registry import ENGINES
from llmgw.engines.wheel_locks import locked_versions
from llmgw.proto.llmgw import v1 as pb

# The llama.cpp build this release was checked against: the version every node
# installs when server.yaml's `engines:` does not name one: the build
# scripts/build-llama-server.sh makes and tests/e2e/test_llamacpp.py runs end
# to end (a test holds the three together, and the docs to them).
DEFAULT_LLAMACPP_VERSION = "b11434"

DEFAULT_ENGINES: Mapping[str, str] = {"llamacpp": DEFAULT_LLAMACPP_VERSION}

# Ships inside llmgw: never installed, never missing, so never asked for.
BUILT_IN_ENGINES = frozenset({"sim"})


def default_version(engine: str) -> str:
    """The version of engine a node installs when asked for it without one: llama.cpp's checked
    build, the newest lock llmgw ships for the others; "" for an engine nodes cannot install."""
    if engine in BUILT_IN_ENGINES or engine not in ENGINES or ENGINES[engine].recipe is None:
        return ""
    return DEFAULT_ENGINES.get(engine) or next(reversed(locked_versions(engine, "cpu")), "")


def how_to_get(engine: str) -> str:
    """What to set so that a node has engine: server.yaml's `engines` for one the agent installs,
    agent.yaml's `engines.NAME.binary` for a build of one's own (the only way for SGLang); "" for
    the sim, built into every agent."""
    if engine in BUILT_IN_ENGINES:
        return ""
    own = f"agent.yaml `engines.{engine}.binary`"
    recipe = ENGINES[engine].recipe if engine in ENGINES else None
    if recipe is None:
        return f"install it on the node and set {own} to it"
    version = default_version(engine) or "VERSION"
    return (
        f'set server.yaml `engines: {{{engine}: "{version}"}}` for every node to install it, '
        f"or {own} to a build of your own"
    )


def wanted_engines(configured: Mapping[str, str]) -> dict[str, str]:
    """Engine -> version every node should have: the defaults, overridden by server.yaml's `engines:`.

    An empty version removes an engine, default or not: a cluster that runs
    only vLLM has no use for llama.cpp being downloaded onto every node.
    """
    merged = {**DEFAULT_ENGINES, **configured}
    return {
        engine: version.strip()
        for engine, version in sorted(merged.items())
        if version.strip() and engine not in BUILT_IN_ENGINES
    }


def provision_message(
    configured: Mapping[str, str], mirror: EngineMirrorConfig | None = None
) -> pb.Provision:
    """The Provision sent to every node as it registers; with server.yaml's mirror, when it names one.

    The mirror and its checksums replace the publisher's on every node
    (agent/provision/installer.py, Source): an offline site's nodes never
    ask GitHub, and check each archive against what the control plane holds.
    """
    mirror = mirror or EngineMirrorConfig()
    return pb.Provision(
        engines=[pb.EngineWant(engine=e, version=v) for e, v in wanted_engines(configured).items()],
        base_url=mirror.base_url.strip(),
        checksums=dict(mirror.checksums),
    )
