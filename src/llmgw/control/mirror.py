"""The control plane's side of the mirror: its admin API relayed, and `mirror:` sources resolved.

`llmgw ctl mirror` and the /admin/mirror page talk to the server's own admin
API; the server relays to the mirror's admin listener with its client
certificate, the one certificate the mirror answers. Nothing else holds that
key, so the mirror's API needs no token of its own.

The relay's routes (adminapi/mirror.py) pass the request on as it is, and the
mirror's answer and status back.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import cattrs
import structlog
from aiohttp import web

from llmgw import strictjson, weightsformat
from llmgw.bodies import MAX_ADMIN_BODY, BadJson, read_json
from llmgw.config import MirrorClientConfig, ModelConfig
from llmgw.errors import LlmgwError
from llmgw.hubref import COMMIT_PATTERN, SOURCE_PREFIX, parse_ref
from llmgw.mirror.admin import Fetch
from llmgw.mirror.fetch import FetchedModel
from llmgw.pki import https_client_ssl_context

log = structlog.get_logger(__name__)

_TIMEOUT_S = 10.0
_converter = cattrs.Converter()
_NO_MIRROR = "no mirror is configured: set mirror.api, mirror.url and mirror.tls in server.yaml"

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class MirrorError(LlmgwError):
    """The mirror could not be asked, or does not hold what a model names."""


class MirrorClient:
    """The mirror's admin listener, reached with the control plane's client certificate."""

    def __init__(self, cfg: MirrorClientConfig) -> None:
        self.cfg = cfg
        self.api = cfg.api.rstrip("/")
        self.files_url = cfg.url.rstrip("/")
        self._ssl: ssl.SSLContext | None = None
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> MirrorClient:
        # Reading the certificates touches the disk.
        self._ssl = await asyncio.to_thread(https_client_ssl_context, self.cfg.tls, "the mirror's client")
        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=_TIMEOUT_S))
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._session is not None:
            await self._session.close()

    async def call(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        """(status, JSON) of the mirror's answer; MirrorError when it cannot be reached."""
        assert self._session is not None and self._ssl is not None, "MirrorClient is used in `async with`"
        try:
            async with self._session.request(method, self.api + path, json=body, ssl=self._ssl) as reply:
                try:
                    data = await reply.json(content_type=None)
                except ValueError:
                    data = None
                return reply.status, data
        except (aiohttp.ClientError, TimeoutError, ssl.SSLError) as exc:
            raise MirrorError(
                f"the mirror's admin listener at {self.api} cannot be reached: {exc or type(exc).__name__}"
            ) from None

    async def models(self) -> list[FetchedModel]:
        status, data = await self.call("GET", "/api/v1/models")
        if status != 200 or not isinstance(data, dict):
            raise MirrorError(f"the mirror at {self.api} answered HTTP {status} when asked for its models")
        try:
            return _converter.structure(data["models"], list[FetchedModel])
        except (KeyError, cattrs.BaseValidationError):
            raise MirrorError(f"the mirror at {self.api} did not answer with its models") from None

    async def fetches(self) -> list[Fetch]:
        status, data = await self.call("GET", "/api/v1/fetches")
        if status != 200 or not isinstance(data, dict):
            raise MirrorError(f"the mirror at {self.api} answered HTTP {status} when asked for its fetches")
        try:
            return _converter.structure(data["fetches"], list[Fetch])
        except (KeyError, cattrs.BaseValidationError):
            raise MirrorError(f"the mirror at {self.api} did not answer with its fetches") from None

    async def resolve(self, source: str) -> tuple[str, dict[str, str]]:
        """Where nodes fetch `mirror:REPO[@REVISION]` from, and its pins; MirrorError when it is not held."""
        repo, revision = parse_mirror_source(source)
        held = [m for m in await self.models() if m.repo == repo]
        if COMMIT_PATTERN.fullmatch(revision):
            found = [m for m in held if m.commit == revision]
        else:
            found = [m for m in held if m.revision == revision]
        if not found:
            have = ", ".join(f"{m.repo}@{m.commit[:12]} ({m.revision})" for m in held) or "none of it"
            raise MirrorError(
                f"{source}: the mirror does not hold {repo}@{revision} (it has {have}); "
                f"`llmgw ctl mirror fetch {repo}@{revision}` fetches it"
            )
        if len({m.commit for m in found}) > 1:
            commits = ", ".join(m.commit[:12] for m in found)
            raise MirrorError(
                f"{source}: the mirror holds several commits fetched as {revision!r} ({commits}); "
                "name the commit in the source, or delete the older ones"
            )
        model = found[0]
        return f"{self.files_url}/files/{model.repo}/{model.commit}/", model.pins()


async def format_problem(client: MirrorClient | None, model: ModelConfig) -> str | None:
    """Why a profile of model cannot load the files the mirror holds for its source; None when it can.

    A model the mirror does not hold yet, or a mirror that cannot be asked, is not refused for it:
    placement says so, and the model is served once the files are there.
    """
    if client is None or not model.source.startswith(SOURCE_PREFIX):
        return None
    try:
        _, pins = await client.resolve(model.source)
    except MirrorError:
        return None
    fmt = weightsformat.format_of(pins)
    refused = weightsformat.engine_problem(model, fmt) if fmt is not None else None
    return f"{model.name}: {refused[1]}" if refused is not None else None


def parse_mirror_source(source: str) -> tuple[str, str]:
    """ "mirror:org/model@rev" -> (repo, revision); MirrorError in words when it is not one."""
    try:
        return parse_ref(source.removeprefix(SOURCE_PREFIX))
    except LlmgwError as exc:
        raise MirrorError(f"{source}: {exc}") from None


# --- the relay --------------------------------------------------------------------------------

MIRROR_CLIENT_KEY: web.AppKey[MirrorClient | None] = web.AppKey("llmgw.admin.mirror", MirrorClient)


def relay(mirror_path: Callable[[web.Request], str]) -> Handler:
    """A handler that asks the mirror's admin listener at mirror_path(request) what request asks."""

    async def handler(request: web.Request) -> web.Response:
        client = request.app[MIRROR_CLIENT_KEY]
        if client is None:
            return strictjson.response(
                {"error": _NO_MIRROR},
                status=404,
            )
        body = None
        if request.method == "POST":
            try:
                body = await read_json(request, MAX_ADMIN_BODY)
            except BadJson as exc:
                return strictjson.response({"error": str(exc)}, status=exc.status)
        path = mirror_path(request)
        if request.query_string:
            path += "?" + request.query_string
        try:
            status, data = await client.call(request.method, path, body)
        except MirrorError as exc:
            return strictjson.response({"error": str(exc)}, status=502)
        if not isinstance(data, dict):
            return strictjson.response(
                {"error": f"the mirror at {client.api} answered HTTP {status} with no JSON"}, status=502
            )
        return strictjson.response(data, status=status)

    return handler
