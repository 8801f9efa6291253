"""How `llmgw ctl`'s commands reach the admin API: where it is, one request, its reply read as a view.

Apart from cli/ctl.py so that commands in modules of their own (cli/model_plan.py,
cli/bench.py) use the same client, and ctl.py adds them without an import cycle.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any, NoReturn, TypeVar

import aiohttp
import attrs
import cattrs
import click

from llmgw import bound, config, strictjson
from llmgw.adminapi import views
from llmgw.cli.exit import EXIT_CONFIG, EXIT_DENIED, EXIT_ERROR, EXIT_NOT_FOUND, EXIT_UNREACHABLE, EXIT_USAGE
from llmgw.config import ServerConfig
from llmgw.errors import ConfigError
from llmgw.listen import split_host_port

DEFAULT_CONFIG = Path("/etc/llmgw/server.yaml")
# A log request waits up to 10 s for its node; the client waits a little longer, so that it is
# the server's sentence ("node n1 did not answer") a person reads, not a bare timeout.
_TIMEOUT_S = 15.0

_View = TypeVar("_View")


@attrs.frozen
class Target:
    url: str
    token: str | None
    as_json: bool
    # Read for the url only when a command runs, so `llmgw ctl nodes --help` works without server.yaml.
    config_path: Path = DEFAULT_CONFIG


def fail(message: str, code: int) -> NoReturn:
    click.echo(f"llmgw ctl: {message}", err=True)
    sys.exit(code)


def admin_url(config_path: Path) -> str:
    """The admin listener of the server config_path configures: as it bound it, or as configured."""
    return _listener_url(config_path, "admin_listen", "--server URL")


def gateway_url(config_path: Path) -> str:
    """The gateway (client port) of the server config_path configures: as it bound it, or as configured."""
    return _listener_url(config_path, "listen", "--gateway URL")


def _listener_url(config_path: Path, key: str, option: str) -> str:
    try:
        cfg = config.load(ServerConfig, config_path)
        # A server started with `--admin-listen 127.0.0.1:0` listens on a port server.yaml does not
        # name; it records the one it got in its state directory (bound.py).
        running = bound.read(Path(cfg.state_dir))
        if key == "listen":
            address = running.gateway if running is not None else cfg.listen
        else:
            address = running.admin if running is not None else cfg.admin_listen
        host, port = split_host_port(address, key)
    except ConfigError as exc:
        fail(f"{exc} (or say where the server is with {option})", EXIT_CONFIG)
    if host in ("0.0.0.0", "::", ""):
        host = "127.0.0.1"
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def error_text(body: Any, status: int) -> str:
    error = body.get("error") if isinstance(body, dict) else None
    if isinstance(error, dict):  # OpenAI's shape, from the gateway in front of /admin
        error = error.get("message")
    return str(error) if error else f"the server answered {status}"


async def call(
    target: Target,
    method: str,
    path: str,
    body: Any = None,
    yaml_text: str | None = None,
    timeout_s: float = _TIMEOUT_S,
) -> tuple[int, Any]:
    headers = {"Authorization": f"Bearer {target.token}"} if target.token else {}
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    if method != "GET" and body is None:
        # The admin listener takes changes as JSON only (what keeps other sites from making them).
        body = {}
    # A model's definition goes as the YAML it was written in, so errors name its lines.
    content: dict[str, Any] = {"json": body}
    if yaml_text is not None:
        content = {"data": yaml_text.encode(), "headers": {**headers, "Content-Type": "application/yaml"}}
    else:
        content["headers"] = headers
    async with (
        aiohttp.ClientSession(timeout=timeout) as session,
        session.request(method, target.url + path, **content) as reply,
    ):
        try:
            data = await reply.json(content_type=None)
        except ValueError:
            data = None
        return reply.status, data


def exchange(
    target: Target,
    method: str,
    path: str,
    body: Any = None,
    yaml_text: str | None = None,
    timeout_s: float = _TIMEOUT_S,
) -> tuple[int, Any]:
    try:
        return asyncio.run(call(target, method, path, body, yaml_text, timeout_s))
    except (aiohttp.ClientConnectionError, TimeoutError) as exc:
        fail(f"cannot reach the admin API at {target.url}: {exc or type(exc).__name__}", EXIT_UNREACHABLE)
    except aiohttp.InvalidURL:
        fail(f"--server {target.url} is not a URL; expected one like http://127.0.0.1:9090", EXIT_USAGE)


def exit_code(status: int) -> int:
    if status in (401, 403):
        return EXIT_DENIED
    return EXIT_NOT_FOUND if status == 404 else EXIT_ERROR


def request(target: Target, method: str, path: str, body: Any = None, yaml_text: str | None = None) -> Any:
    """The JSON the admin API answers with; any failure ends the command with its exit code."""
    status, data = exchange(target, method, path, body, yaml_text)
    if status >= 400:
        fail(error_text(data, status), exit_code(status))
    return data


def read(data: Any, view: type[_View]) -> _View:
    """The reply as the view it is; a reply of another shape ends the command saying so."""
    try:
        return views.CONVERTER.structure(data, view)
    except cattrs.BaseValidationError as exc:
        # A server of another llmgw version, or something else listening on the admin port.
        what = "; ".join(cattrs.transform_error(exc)[:3])
        fail(
            f"the admin API's reply is not one this ctl reads ({what}); is the server another llmgw version?",
            EXIT_ERROR,
        )


def print_json(data: Any) -> None:
    click.echo(strictjson.dumps(data, indent=2, sort_keys=True))


json_option = click.option(
    "--json", "as_json", is_flag=True, help="Print the admin API's JSON instead of a table."
)


def target(ctx: click.Context, as_json: bool) -> Target:
    target: Target = ctx.obj
    url = target.url or admin_url(target.config_path)
    return attrs.evolve(target, url=url, as_json=target.as_json or as_json)


def get_view(ctx: click.Context, as_json: bool, path: str, view: type[_View]) -> _View | None:
    """GET path on the admin API: the reply as view, or None once printed as it is under --json."""
    there = target(ctx, as_json)
    data = request(there, "GET", path)
    if there.as_json:
        print_json(data)
        return None
    return read(data, view)
