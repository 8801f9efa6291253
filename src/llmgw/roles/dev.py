"""Dev mode: a whole system in one directory, with its own authority.

Everything lives under the dev directory so that trying llmgw on a laptop
touches nothing else, and the configuration files it writes are kept: edit
them and the next `--dev` run uses them.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import attrs

from llmgw import config, pki
from llmgw.catalog import load_server_config
from llmgw.config import (
    AgentConfig,
    EngineOptions,
    MirrorConfig,
    ModelConfig,
    ProfileConfig,
    ServerConfig,
    TLSConfig,
)
from llmgw.control.stream.provision import BUILT_IN_ENGINES, default_version
from llmgw.engines.registry import ENGINES
from llmgw.errors import ConfigError

DEV_NODE = "dev-node"
DEV_MODEL = "sim-chat"


@attrs.frozen
class DevSetup:
    dir: Path
    server: ServerConfig | None
    agent: AgentConfig | None
    mirror: MirrorConfig | None


def _ensure_pki(pki_dir: Path) -> None:
    if not (pki_dir / "ca.pem").exists():
        pki.init_ca(pki_dir)
    if not (pki_dir / "server.pem").exists():
        pki.issue_server(pki_dir, "server", ["localhost", "127.0.0.1"], pki_dir)
    if not (pki_dir / f"{DEV_NODE}.pem").exists():
        pki.issue_agent(pki_dir, DEV_NODE, pki_dir)


def _write_once(path: Path, value: object) -> None:
    if not path.exists():
        path.write_text(config.dump(value), encoding="utf-8")


def with_engines(setup: DevSetup, binaries: Mapping[str, str], installs: Mapping[str, str]) -> DevSetup:
    """setup with engines for this run only: binaries (`--engine NAME=PATH`) for the dev node to run,
    installs (`--install NAME[=VERSION]`) for it to install; ConfigError naming what is wrong.

    A person trying a real model in dev mode otherwise had to find and edit both files under the
    dev directory; the files stay as they are, and the next run without the flags is the sim again.
    """
    for name in [*binaries, *installs]:
        if name not in ENGINES or name in BUILT_IN_ENGINES:
            known = ", ".join(n for n in sorted(ENGINES) if n not in BUILT_IN_ENGINES)
            raise ConfigError(f"there is no engine called {name!r} to run or install (engines: {known})")
    for name, binary in binaries.items():
        if not Path(binary).is_file():
            raise ConfigError(f"--engine {name}={binary}: no such file")
    server, agent = setup.server, setup.agent
    if server is not None and installs:
        wanted = {}
        for name, version in installs.items():
            version = version or default_version(name)
            if not version:
                raise ConfigError(
                    f"--install {name}: nodes cannot install {name} themselves; install it and run "
                    f"with --engine {name}=PATH"
                )
            wanted[name] = version
        server = config.evolve(server, engines={**server.engines, **wanted})
    if agent is not None and binaries:
        engines = dict(agent.engines)
        for name, binary in binaries.items():
            engines[name] = config.evolve(
                engines.get(name, EngineOptions()), binary=str(Path(binary).resolve())
            )
        agent = config.evolve(agent, engines=engines)
    return attrs.evolve(setup, server=server, agent=agent)


def prepare_dev(dev_dir: Path, roles: tuple[str, ...]) -> DevSetup:
    """Create what is missing under dev_dir and load the configurations of the given roles."""
    pki_dir = dev_dir / "pki"
    pki_dir.mkdir(parents=True, exist_ok=True)
    _ensure_pki(pki_dir)
    server = ServerConfig(
        listen="127.0.0.1:8080",
        admin_listen="127.0.0.1:9090",
        # Port 0: the in-process agent is told the port the server bound.
        agent_listen="127.0.0.1:0",
        state_dir=str(dev_dir),
        tls=TLSConfig(
            ca=str(pki_dir / "ca.pem"), cert=str(pki_dir / "server.pem"), key=str(pki_dir / "server-key.pem")
        ),
        models=[ModelConfig(name=DEV_MODEL, replicas=1, profiles=[ProfileConfig(engine="sim")])],
        # Dev mode installs nothing: trying llmgw on a laptop must not download llama.cpp or run
        # apt-get. `--install llamacpp` (or a version in the dev server.yaml) installs it.
        engines={"llamacpp": ""},
    )
    agent = AgentConfig(
        node_id=DEV_NODE,
        servers=["127.0.0.1:7443"],
        state_dir=str(dev_dir / "agent"),
        tls=TLSConfig(
            ca=str(pki_dir / "ca.pem"),
            cert=str(pki_dir / f"{DEV_NODE}.pem"),
            key=str(pki_dir / f"{DEV_NODE}-key.pem"),
        ),
    )
    mirror = MirrorConfig(listen="127.0.0.1:8081", root=str(dev_dir / "mirror"))
    _write_once(dev_dir / "server.yaml", server)
    _write_once(dev_dir / "agent.yaml", agent)
    _write_once(dev_dir / "mirror.yaml", mirror)
    (dev_dir / "mirror").mkdir(exist_ok=True)
    return DevSetup(
        dir=dev_dir,
        # Kept once written, so edited by hand: its models are checked as a server.yaml's are.
        server=load_server_config(dev_dir / "server.yaml") if "server" in roles else None,
        # Whatever agent.yaml says: dev mode promises that Ctrl-C leaves no engine process behind.
        agent=(
            config.evolve(config.load(AgentConfig, dev_dir / "agent.yaml"), keep_engines_on_stop=False)
            if "agent" in roles
            else None
        ),
        mirror=config.load(MirrorConfig, dev_dir / "mirror.yaml") if "mirror" in roles else None,
    )
