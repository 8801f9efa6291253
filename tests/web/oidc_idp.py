"""A real OpenID Connect provider for the sign-in tests: the npm registry's oidc-provider, run by node.

It listens on a loopback port of its own, signs ID tokens with keys the test chooses (so that a
test can rotate them), has one client (PKCE required) and reads its users, with their groups,
from a JSON file at every sign-in (so that a test can take a person out of a group). Its login
and consent pages are the package's plain development forms, which `sign_in_at_provider` posts.
"""

from __future__ import annotations

import asyncio
import contextlib
import html
import json
import re
import socket
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import attrs
from joserfc.jwk import RSAKey

from tests.needs import npm_package, program

CLIENT_ID = "llmgw-pages"
CLIENT_SECRET = "s3cret-of-the-client"

_SCRIPT = """
import { readFileSync } from 'node:fs';
import Provider from %(module)s;
const conf = JSON.parse(readFileSync(process.argv[2], 'utf8'));
const provider = new Provider(conf.issuer, {
  clients: [conf.client],
  jwks: conf.jwks,
  pkce: { required: () => true },
  claims: { openid: ['sub'], email: ['email', 'email_verified'], groups: ['groups'] },
  scopes: ['openid', 'email', 'groups'],
  conformIdTokenClaims: false,
  features: { devInteractions: { enabled: true }, rpInitiatedLogout: { enabled: true } },
  cookies: { keys: ['a key of the test provider'] },
  async findAccount(ctx, id) {
    const users = JSON.parse(readFileSync(conf.users, 'utf8'));
    const user = users[id];
    if (!user) return undefined;
    return {
      accountId: id,
      async claims() { return { sub: id, email: user.email, email_verified: true, groups: user.groups }; },
    };
  },
});
provider.listen(conf.port, '127.0.0.1', () => { console.log('listening'); });
"""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def new_key(kid: str) -> dict[str, object]:
    return RSAKey.generate_key(
        2048, parameters={"kid": kid, "use": "sig", "alg": "RS256"}, private=True
    ).as_dict(private=True)


@attrs.define
class Idp:
    port: int
    workdir: Path
    redirect_uri: str
    post_logout_uri: str
    keys: list[dict[str, object]]
    users: dict[str, dict[str, object]] = attrs.field(factory=dict)
    _process: asyncio.subprocess.Process | None = None

    @property
    def issuer(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def set_user(self, login: str, email: str, groups: list[str]) -> None:
        self.users[login] = {"email": email, "groups": groups}
        (self.workdir / "users.json").write_text(json.dumps(self.users))

    async def start(self) -> None:
        module = npm_package("oidc-provider") / "lib" / "index.js"
        script = self.workdir / "idp.mjs"
        script.write_text(_SCRIPT % {"module": json.dumps(str(module))})
        (self.workdir / "users.json").write_text(json.dumps(self.users))
        conf = {
            "issuer": self.issuer,
            "port": self.port,
            "users": str(self.workdir / "users.json"),
            "jwks": {"keys": self.keys},
            "client": {
                "client_id": CLIENT_ID,
                "client_secret": CLIENT_SECRET,
                "redirect_uris": [self.redirect_uri],
                "post_logout_redirect_uris": [self.post_logout_uri],
                "grant_types": ["authorization_code"],
                "response_types": ["code"],
                "token_endpoint_auth_method": "client_secret_basic",
            },
        }
        (self.workdir / "conf.json").write_text(json.dumps(conf))
        self._process = await asyncio.create_subprocess_exec(
            program("node", "nodejs"),
            str(script),
            str(self.workdir / "conf.json"),
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        assert self._process.stdout is not None
        line = await asyncio.wait_for(self._process.stdout.readline(), 60)
        while line and b"listening" not in line:
            line = await asyncio.wait_for(self._process.stdout.readline(), 60)
        assert b"listening" in line, "oidc-provider did not start"

    async def stop(self) -> None:
        if self._process is not None and self._process.returncode is None:
            self._process.terminate()
            await self._process.wait()
        self._process = None

    async def rotate(self, kid: str) -> None:
        """Restart signing with a new key only: tokens from now on name a key not published before.

        With the kid of the key it signs with now, the new key is a stranger under a known name.
        """
        await self.stop()
        self.keys = [new_key(kid)]
        await self.start()


@contextlib.asynccontextmanager
async def running_idp(workdir: Path, site_url: str, port: int) -> AsyncIterator[Idp]:
    idp = Idp(
        port=port,
        workdir=workdir,
        redirect_uri=f"{site_url}/login/oidc/callback",
        post_logout_uri=f"{site_url}/login",
        keys=[new_key("first")],
    )
    await idp.start()
    try:
        yield idp
    finally:
        await idp.stop()


_ACTION = re.compile(r'<form[^>]*action="([^"]+)"', re.S)
_HIDDEN = re.compile(r'<input[^>]*type="hidden"[^>]*name="([^"]+)"[^>]*value="([^"]*)"', re.S)


async def _post_form(
    client: aiohttp.ClientSession, response: aiohttp.ClientResponse, **fields: str
) -> aiohttp.ClientResponse:
    page = await response.text()
    action = _ACTION.search(page)
    assert action is not None, f"the provider's page has no form: {page[:500]}"
    target = response.url.join(aiohttp.client.URL(html.unescape(action.group(1))))
    data = {name: html.unescape(value) for name, value in _HIDDEN.findall(page)}
    data.update(fields)
    return await client.post(target, data=data)


async def sign_in_at_provider(
    client: aiohttp.ClientSession, login: str, start: str = "/login/oidc"
) -> aiohttp.ClientResponse:
    """Follow /login/oidc to the provider, post its login and consent forms, and come back.

    Returns the last response: the page signing in led to (or the refusal).
    """
    return await through_provider(client, await client.get(start), login)


async def through_provider(
    client: aiohttp.ClientSession, response: aiohttp.ClientResponse, login: str
) -> aiohttp.ClientResponse:
    """From the provider's login page (response), post its login and consent forms and come back."""
    if "/interaction/" not in response.url.path:
        return response
    response = await _post_form(client, response, login=login, password="anything")
    if "/interaction/" in response.url.path:
        response = await _post_form(client, response)
    return response
