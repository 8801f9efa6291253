"""Running roles: their configuration, the dev setup, and the roles started in a Runner (runner.py)."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Mapping
from pathlib import Path

import click

from llmgw import config
from llmgw.agent.current import restart_into_current
from llmgw.agent.trial import Restart
from llmgw.catalog import load_server_config
from llmgw.cli.runner import Runner
from llmgw.config import AgentConfig, MirrorConfig, ServerConfig
from llmgw.errors import ConfigError

# Imported here, before the loop starts, never inside it: importing reads files.
from llmgw.roles.agent import AgentHandle, agent_role
from llmgw.roles.dev import DevSetup, prepare_dev, with_engines
from llmgw.roles.mirror import mirror_role
from llmgw.roles.server import server_role
from llmgw.tasks import first_to_finish

_DEFAULT_CONFIG = {
    "server": Path("/etc/llmgw/server.yaml"),
    "agent": Path("/etc/llmgw/agent.yaml"),
    "mirror": Path("/etc/llmgw/mirror.yaml"),
}


def _load_configs(
    roles: tuple[str, ...], configs: tuple[Path, ...]
) -> tuple[ServerConfig | None, AgentConfig | None, MirrorConfig | None]:
    if len(configs) > len(roles):
        raise click.UsageError(
            "more --config files than --role options: give one per role, in the same order"
        )
    paths = dict(zip(roles, configs, strict=False))
    server = load_server_config(paths.get("server", _DEFAULT_CONFIG["server"])) if "server" in roles else None
    agent = (
        config.load(AgentConfig, paths.get("agent", _DEFAULT_CONFIG["agent"])) if "agent" in roles else None
    )
    mirror = (
        config.load(MirrorConfig, paths.get("mirror", _DEFAULT_CONFIG["mirror"]))
        if "mirror" in roles
        else None
    )
    return server, agent, mirror


def serve(
    *,
    roles: tuple[str, ...],
    configs: tuple[Path, ...],
    dev: bool,
    dev_dir: Path,
    listen: str | None,
    engine_binaries: Mapping[str, str] | None = None,
    engine_installs: Mapping[str, str] | None = None,
    admin_listen: str | None = None,
    drain_timeout: float | None = None,
    loop: str = "asyncio",
) -> int:
    """Run the roles until a signal, on the event loop named loop; returns the exit code."""
    roles = tuple(dict.fromkeys(roles))
    # Before anything is written or listens: a missing uvloop is said at once.
    loop_factory = event_loop(loop)
    # Before anything is written or listens, as the keys they override are checked.
    for key, value, flag in (
        ("listen", listen, "--listen"),
        ("admin_listen", admin_listen, "--admin-listen"),
        ("drain_timeout_s", drain_timeout, "--drain-timeout"),
    ):
        if value is not None:
            config.check_flag(ServerConfig, key, value, flag)
    setup: DevSetup | None = None
    if dev:
        setup = with_engines(
            prepare_dev(dev_dir.resolve(), roles), engine_binaries or {}, engine_installs or {}
        )
        server_cfg, agent_cfg, mirror_cfg = setup.server, setup.agent, setup.mirror
    else:
        server_cfg, agent_cfg, mirror_cfg = _load_configs(roles, configs)
    if listen is not None and server_cfg is not None:
        server_cfg = config.evolve(server_cfg, listen=listen)
    if admin_listen is not None and server_cfg is not None:
        server_cfg = config.evolve(server_cfg, admin_listen=admin_listen)
    if drain_timeout is not None and server_cfg is not None:
        server_cfg = config.evolve(server_cfg, drain_timeout_s=drain_timeout)
    if server_cfg is not None and (listen or admin_listen) and (found := server_cfg.problem_across_keys()):
        raise ConfigError(f"with --listen or --admin-listen, {found[1]}")
    if agent_cfg is not None and (into_current := restart_into_current(Path(agent_cfg.state_dir))):
        # Before any role starts: a supervisor's restart runs the release the node committed to.
        os.execve(into_current.argv[0], into_current.argv, into_current.env)
    drain_s = drain_timeout_s(server_cfg, drain_timeout)
    with asyncio.Runner(loop_factory=loop_factory) as runner:
        code, restart = runner.run(_run(server_cfg, agent_cfg, mirror_cfg, setup, drain_s))
    if restart is not None:
        # After every role has stopped, its engines left running: the new image adopts them.
        os.execve(restart.argv[0], restart.argv, restart.env)
    return code


def event_loop(name: str) -> Callable[[], asyncio.AbstractEventLoop] | None:
    """What makes the event loop named name: None for asyncio's own, uvloop's where it is installed."""
    if name == "asyncio":
        return None
    if name != "uvloop":
        raise ConfigError(f"--loop {name}: the loop is asyncio or uvloop")
    try:
        import uvloop
    except ImportError:
        raise ConfigError(
            "--loop uvloop: uvloop is not installed here; install it with `pip install 'llmgw[uvloop]'`, "
            "or run on asyncio's own loop (leave out --loop)"
        ) from None
    return uvloop.new_event_loop


def drain_timeout_s(server_cfg: ServerConfig | None, flag: float | None) -> float:
    """How long the roles may drain: --drain-timeout, else the server's drain_timeout_s.

    Without a server role, the drain_timeout_s a server.yaml would get by default.
    """
    if flag is not None:
        return flag
    if server_cfg is not None:
        return server_cfg.drain_timeout_s
    return ServerConfig().drain_timeout_s


async def _run(
    server_cfg: ServerConfig | None,
    agent_cfg: AgentConfig | None,
    mirror_cfg: MirrorConfig | None,
    setup: DevSetup | None,
    drain_s: float,
) -> tuple[int, Restart | None]:
    """Run the roles until a signal, or until the agent decides to restart into another release."""
    agent: AgentHandle | None = None
    async with Runner(drain_s) as runner:
        server = None
        if server_cfg is not None:
            server = await runner.start(server_role(server_cfg))
        if agent_cfg is not None:
            if server is not None and setup is not None:
                # The in-process agent still dials the server over TLS, at the
                # port the server actually bound.
                agent_cfg = config.evolve(agent_cfg, servers=[f"127.0.0.1:{server.agent_port}"])
            agent = await runner.start(agent_role(agent_cfg))
            runner.on_force(agent.kill_engines)
        if mirror_cfg is not None:
            await runner.start(mirror_role(mirror_cfg))
        if server is not None and setup is not None:
            key = await server.create_dev_key()
            _print_banner(server.gateway_url, key)
            click.echo(f"Cluster page and admin API (this machine only): {server.admin_url}/")
        if agent is None:
            await runner.wait()
        else:
            await first_to_finish(runner.wait(), agent.upgrader.restart_wanted.wait())
    return runner.code, agent.upgrader.restart if agent is not None else None


def _print_banner(url: str, key: str) -> None:
    click.echo(
        "\n".join(
            [
                "",
                f"llmgw is running. Gateway: {url}",
                f"API key (shown once): {key}",
                "Try it:",
                f"  curl -s {url}/v1/chat/completions -H 'Authorization: Bearer {key}' "
                "-H 'Content-Type: application/json' "
                '-d \'{"model": "sim-chat", "messages": [{"role": "user", "content": "Hello"}]}\'',
                "Press Ctrl-C to stop.",
                "",
            ]
        )
    )
