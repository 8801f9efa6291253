"""Running roles: the one place that handles SIGINT and SIGTERM.

The first signal drains: the gateway stops taking requests, in-flight ones
finish, the agent stops its engines. A second signal forces the exit, and even
then no engine is left behind: every engine's process group is killed first.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import Callable
from pathlib import Path

import click
import structlog

from llmgw import config
from llmgw.catalog import load_server_config
from llmgw.cli.exit import EXIT_ERROR, EXIT_FORCED, EXIT_OK
from llmgw.config import AgentConfig, MirrorConfig, ServerConfig

# Imported here, before the loop starts, never inside it: importing reads files.
from llmgw.roles.agent import agent_role
from llmgw.roles.dev import DevSetup, prepare_dev
from llmgw.roles.mirror import mirror_role
from llmgw.roles.server import server_role

log = structlog.get_logger(__name__)

_DEFAULT_CONFIG = {
    "server": Path("/etc/llmgw/server.yaml"),
    "agent": Path("/etc/llmgw/agent.yaml"),
    "mirror": Path("/etc/llmgw/mirror.yaml"),
}
# Beyond the configured drain, how long stopping may take before it is forced.
_STOP_SLACK_S = 20.0


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
    admin_listen: str | None = None,
) -> int:
    """Run the roles until a signal; returns the exit code."""
    roles = tuple(dict.fromkeys(roles))
    setup: DevSetup | None = None
    if dev:
        setup = prepare_dev(dev_dir.resolve(), roles)
        server_cfg, agent_cfg, mirror_cfg = setup.server, setup.agent, setup.mirror
    else:
        server_cfg, agent_cfg, mirror_cfg = _load_configs(roles, configs)
    if listen is not None and server_cfg is not None:
        server_cfg = config.evolve(server_cfg, listen=listen)
    if admin_listen is not None and server_cfg is not None:
        server_cfg = config.evolve(server_cfg, admin_listen=admin_listen)
    return asyncio.run(_run(server_cfg, agent_cfg, mirror_cfg, setup))


async def _run(
    server_cfg: ServerConfig | None,
    agent_cfg: AgentConfig | None,
    mirror_cfg: MirrorConfig | None,
    setup: DevSetup | None,
) -> int:

    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    force_hooks: list[Callable[[], None]] = []
    signals_seen = 0

    def on_signal(signum: int) -> None:
        nonlocal signals_seen
        signals_seen += 1
        if signals_seen == 1:
            log.info("stopping: draining in-flight work; a second signal forces the exit", signal=signum)
            stop.set()
            return
        log.warning("forced to stop: killing engines now", signal=signum)
        for hook in force_hooks:
            hook()
        os._exit(EXIT_FORCED)

    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, on_signal, signum)

    drain_s = server_cfg.drain_timeout_s if server_cfg else 10.0
    stack = contextlib.AsyncExitStack()
    try:
        await stack.__aenter__()
        server = None
        if server_cfg is not None:
            server = await stack.enter_async_context(server_role(server_cfg))
        if agent_cfg is not None:
            if server is not None and setup is not None:
                # The in-process agent still dials the server over TLS, at the
                # port the server actually bound.
                agent_cfg = config.evolve(agent_cfg, servers=[f"127.0.0.1:{server.agent_port}"])
            agent = await stack.enter_async_context(agent_role(agent_cfg))
            force_hooks.append(agent.kill_engines)
        if mirror_cfg is not None:
            await stack.enter_async_context(mirror_role(mirror_cfg))
        if server is not None and setup is not None:
            key = await server.create_dev_key()
            _print_banner(server.gateway_url, key)
            click.echo(f"Cluster page and admin API (this machine only): {server.admin_url}/")
        await stop.wait()
    except BaseException:
        with contextlib.suppress(BaseException):
            async with asyncio.timeout(drain_s + _STOP_SLACK_S):
                await stack.aclose()
        for hook in force_hooks:
            hook()
        raise
    try:
        async with asyncio.timeout(drain_s + _STOP_SLACK_S):
            await stack.aclose()
    except TimeoutError:
        log.error("stopping took too long: killing engines", limit_s=drain_s + _STOP_SLACK_S)
        for hook in force_hooks:
            hook()
        return EXIT_ERROR
    log.info("stopped")
    return EXIT_OK


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
