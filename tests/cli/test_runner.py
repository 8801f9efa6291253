"""The runner of `llmgw --role …`: start the roles, wait for a signal, drain them in reverse, force."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest

from llmgw.cli.exit import EXIT_ERROR, EXIT_OK
from llmgw.cli.runner import Runner
from llmgw.cli.serve import drain_timeout_s
from llmgw.config import ServerConfig
from llmgw.errors import ConfigError


@asynccontextmanager
async def _role(name: str, events: list[str], *, stuck: bool = False) -> AsyncIterator[str]:
    events.append(f"start {name}")
    yield name
    if stuck:
        await asyncio.Event().wait()
    events.append(f"stop {name}")


@asynccontextmanager
async def _failing_role(events: list[str]) -> AsyncIterator[None]:
    events.append("start broken")
    raise OSError("address already in use")
    yield  # pragma: no cover


@asynccontextmanager
async def _role_whose_task_fails(events: list[str]) -> AsyncIterator[None]:
    """A role that starts, then fails in a task of its own: the agent's stream, on a key it cannot read."""

    async def fail() -> None:
        raise ConfigError("tls.key names /etc/llmgw/pki/n1-key.pem, which this process may not read")

    async with asyncio.TaskGroup() as tasks:
        events.append("start agent")
        tasks.create_task(fail())
        yield
    events.append("stop agent")


class TestRunner:
    async def test_the_first_signal_ends_the_wait_and_the_roles_stop_in_reverse(self) -> None:
        events: list[str] = []
        async with Runner(drain_s=1.0) as runner:
            assert await runner.start(_role("server", events)) == "server"
            await runner.start(_role("agent", events))
            runner.on_force(lambda: events.append("forced"))
            os.kill(os.getpid(), signal.SIGTERM)
            await runner.wait()
        assert events == ["start server", "start agent", "stop agent", "stop server"]
        assert runner.code == EXIT_OK

    async def test_a_drain_past_its_limit_is_forced_and_exits_1(self) -> None:
        events: list[str] = []
        async with Runner(drain_s=0.05, slack_s=0.0) as runner:
            await runner.start(_role("agent", events, stuck=True))
            runner.on_force(lambda: events.append("forced"))
            os.kill(os.getpid(), signal.SIGINT)
            await runner.wait()
        assert events == ["start agent", "forced"]
        assert runner.code == EXIT_ERROR

    async def test_a_role_that_fails_to_start_stops_those_before_it_kills_engines_and_says_why(self) -> None:
        events: list[str] = []
        with pytest.raises(OSError, match="address already in use"):
            async with Runner(drain_s=1.0) as runner:
                await runner.start(_role("server", events))
                runner.on_force(lambda: events.append("forced"))
                await runner.start(_failing_role(events))
        assert events == ["start server", "start broken", "stop server", "forced"]

    async def test_a_role_whose_task_fails_while_running_ends_the_run_with_that_error(self) -> None:
        """It ended in a bare CancelledError: the task group cancelled the waiting body, its error dropped."""
        events: list[str] = []
        with pytest.raises(BaseExceptionGroup) as raised:
            async with Runner(drain_s=1.0) as runner:
                await runner.start(_role("server", events))
                runner.on_force(lambda: events.append("forced"))
                await runner.start(_role_whose_task_fails(events))
                await runner.wait()
        assert raised.group_contains(ConfigError, match="may not read")
        # Every engine killed, as for a role that fails to start.
        assert events == ["start server", "start agent", "forced"]

    async def test_leaving_gives_the_signals_back(self) -> None:
        """A SIGTERM after the runner has stopped is no longer taken for a drain."""
        async with Runner(drain_s=1.0):
            pass
        assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL


class TestDrainTimeout:
    def test_the_flag_wins_over_the_servers_configuration(self) -> None:
        assert drain_timeout_s(ServerConfig(drain_timeout_s=30.0), 2.5) == 2.5

    def test_without_the_flag_the_servers_drain_timeout_s_is_the_drain(self) -> None:
        assert drain_timeout_s(ServerConfig(drain_timeout_s=30.0), None) == 30.0

    def test_without_a_server_role_it_is_drain_timeout_s_by_default(self) -> None:
        assert drain_timeout_s(None, None) == ServerConfig().drain_timeout_s
