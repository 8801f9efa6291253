"""Real `llmgw --role=server` processes for the tests of several servers sharing one store."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import attrs

from llmgw import bound, config
from llmgw.config import ModelConfig, ProfileConfig, ServerConfig

from ..servers import loopback_server_config

MODEL = "sim-chat"
START_S = 60.0

# `python -m llmgw`, with the rate limits' window shortened first: a window that rolls in seconds
# rather than a minute, for a test that waits for it to roll. The window is a minute by definition
# (rpm), so no setting changes it; every use of it reads this one module constant at run time.
_SHORT_WINDOW = (
    "import sys; from llmgw.gateway import quotas; quotas.WINDOW_S = float(sys.argv.pop(1)); "
    "from llmgw.cli.main import main; main()"
)


@attrs.frozen
class Server:
    """A running server: its gateway's URL and its process."""

    url: str
    process: asyncio.subprocess.Process


@contextlib.asynccontextmanager
async def server_process(
    tmp_path: Path, database: str, *, window_s: float | None = None
) -> AsyncIterator[Server]:
    """`llmgw --role=server` in a process of its own on the shared store; started again in the same
    tmp_path, it is the same server (its configuration, state and usage journal), its log appended.

    window_s: the rate limits count this many seconds rather than 60.
    """
    path = tmp_path / "server.yaml"
    if await asyncio.to_thread(path.exists):
        cfg = await asyncio.to_thread(config.load, ServerConfig, path)
    else:
        # Certificates made and files written in a thread: the loop serves the test's requests.
        cfg = await asyncio.to_thread(
            loopback_server_config,
            tmp_path,
            database=database,
            models=[ModelConfig(name=MODEL, profiles=[ProfileConfig(engine="sim")])],
        )
        await asyncio.to_thread(path.write_text, await asyncio.to_thread(config.dump, cfg))
    log = await asyncio.to_thread((tmp_path / "server.log").open, "ab")
    launch = ("-m", "llmgw") if window_s is None else ("-c", _SHORT_WINDOW, str(window_s))
    process = await asyncio.create_subprocess_exec(
        *(sys.executable, *launch, "--role=server", "--config", str(path)), stdout=log, stderr=log
    )
    try:
        state = Path(cfg.state_dir)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + START_S
        while (listening := await asyncio.to_thread(bound.read, state)) is None:
            if process.returncode is not None or loop.time() > deadline:
                text = await asyncio.to_thread((tmp_path / "server.log").read_text)
                raise AssertionError(f"the server did not start:\n{text[-3000:]}")
            await asyncio.sleep(0.1)
        yield Server(f"http://{listening.gateway}", process)
    finally:
        if process.returncode is None:
            process.send_signal(signal.SIGTERM)
            try:
                async with asyncio.timeout(30):
                    await process.wait()
            except TimeoutError:
                process.kill()
                await process.wait()
        log.close()
