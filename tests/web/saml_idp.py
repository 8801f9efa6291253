"""A real SAML 2.0 identity provider for the sign-in tests: Debian's SimpleSAMLphp, served by `php -S`.

It listens on a loopback port of its own, with a configuration directory the test writes: a
signing key and certificate the test can replace (so that its answers stop verifying), the users
with their email and groups (written again when a test moves someone out of a group; PHP reads
the file at every request), and this server as the one service provider it knows. Its login page
is SimpleSAMLphp's plain form, which `sign_in_at_saml_provider` posts.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import attrs
import pytest

from tests.needs import INSTALL, program
from tests.web.oidc_idp import _post_form

SIMPLESAMLPHP = Path("/usr/share/simplesamlphp/www")

_CONFIG = """<?php
$config = [
  'baseurlpath' => %(base)s,
  'certdir' => %(certdir)s,
  'loggingdir' => %(tmp)s,
  'tempdir' => %(tmp)s,
  'datadir' => %(tmp)s,
  'metadatadir' => %(metadatadir)s,
  'secretsalt' => 'a salt of the test provider',
  'auth.adminpassword' => 'not used by the tests',
  'admin.protectmetadata' => false,
  'technicalcontact_email' => 'test@example.com',
  'timezone' => 'UTC',
  'logging.handler' => 'file',
  'logging.logfile' => 'idp.log',
  'enable.saml20-idp' => true,
  'module.enable' => ['exampleauth' => true],
  'store.type' => 'phpsession',
  'session.phpsession.savepath' => %(tmp)s,
  'language.available' => ['en'],
];
"""

_IDP_HOSTED = """<?php
$metadata['__DYNAMIC:1__'] = [
  'host' => '__DEFAULT__',
  'privatekey' => 'idp.pem',
  'certificate' => 'idp.crt',
  'auth' => 'users',
  'attributes.NameFormat' => 'urn:oasis:names:tc:SAML:2.0:attrname-format:basic',
];
"""

_SP_REMOTE = """<?php
$metadata[%(entity)s] = [
  'AssertionConsumerService' => [
    ['Binding' => 'urn:oasis:names:tc:SAML:2.0:bindings:HTTP-POST', 'Location' => %(acs)s],
  ],
];
"""


def _php(value: object) -> str:
    """A PHP literal of a string or a list of strings (JSON's quoting is PHP's for these)."""
    if isinstance(value, list):
        return "[" + ", ".join(_php(item) for item in value) + "]"
    return json.dumps(str(value)).replace("$", "\\$")


@attrs.define
class SamlIdp:
    port: int
    workdir: Path
    site_url: str
    users: dict[str, dict[str, object]] = attrs.field(factory=dict)
    _process: asyncio.subprocess.Process | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def metadata_url(self) -> str:
        return f"{self.url}/saml2/idp/metadata.php"

    def set_user(self, login: str, email: str, groups: list[str]) -> None:
        self.users[login] = {"email": email, "groups": groups}
        entries = "".join(
            f"    {_php(f'{name}:pass-of-{name}')} => ['uid' => [{_php(name)}], "
            f"'email' => [{_php(user['email'])}], 'groups' => {_php(user['groups'])}],\n"
            for name, user in self.users.items()
        )
        text = f"<?php\n$config = [\n  'users' => [\n    'exampleauth:UserPass',\n{entries}  ],\n];\n"
        (self.workdir / "config" / "authsources.php").write_text(text)

    def new_signing_key(self) -> None:
        """A key and certificate the provider signs with from its next answer on."""
        certs = self.workdir / "cert"
        certs.mkdir(exist_ok=True)
        subprocess.run(
            [
                "openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=idp",
                "-keyout", str(certs / "idp.pem"), "-out", str(certs / "idp.crt"),
            ],
            check=True,
            capture_output=True,
        )  # fmt: skip

    async def start(self) -> None:
        if not (SIMPLESAMLPHP / "saml2" / "idp" / "SSOService.php").exists():
            pytest.fail(f"SimpleSAMLphp is not installed (Debian's simplesamlphp package): {INSTALL}")
        config, metadata, tmp = (self.workdir / d for d in ("config", "metadata", "tmp"))
        for folder in (config, metadata, tmp):
            folder.mkdir(exist_ok=True)
        self.new_signing_key()
        values = {
            "base": _php(self.url + "/"),
            "certdir": _php(f"{self.workdir / 'cert'}/"),
            "tmp": _php(f"{tmp}/"),
            "metadatadir": _php(f"{metadata}/"),
        }
        (config / "config.php").write_text(_CONFIG % values)
        (metadata / "saml20-idp-hosted.php").write_text(_IDP_HOSTED)
        sp = {
            "entity": _php(f"{self.site_url}/login/saml/metadata"),
            "acs": _php(f"{self.site_url}/login/saml/acs"),
        }
        (metadata / "saml20-sp-remote.php").write_text(_SP_REMOTE % sp)
        self.set_user("nobody", "nobody@example.com", [])
        self._process = await asyncio.create_subprocess_exec(
            program("php", "php-cli"),
            "-S",
            f"127.0.0.1:{self.port}",
            "-t",
            str(SIMPLESAMLPHP),
            env={"SIMPLESAMLPHP_CONFIG_DIR": str(config), "PATH": "/usr/bin:/bin"},
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL,
        )
        async with aiohttp.ClientSession() as http:
            for _ in range(200):
                with contextlib.suppress(aiohttp.ClientError):
                    async with http.get(self.metadata_url) as response:
                        if response.status == 200 and "IDPSSODescriptor" in await response.text():
                            return
                await asyncio.sleep(0.05)
        raise AssertionError(f"SimpleSAMLphp did not start; see {tmp / 'idp.log'}")

    async def stop(self) -> None:
        if self._process is not None and self._process.returncode is None:
            self._process.terminate()
            await self._process.wait()
        self._process = None


@contextlib.asynccontextmanager
async def running_saml_idp(workdir: Path, site_url: str, port: int) -> AsyncIterator[SamlIdp]:
    idp = SamlIdp(port=port, workdir=workdir, site_url=site_url)
    await idp.start()
    try:
        yield idp
    finally:
        await idp.stop()


async def answer_of_saml_provider(
    client: aiohttp.ClientSession, login: str, start: str = "/login/saml"
) -> aiohttp.ClientResponse:
    """Follow /login/saml to the provider and post its login form: the page that would post the answer.

    The page's form (action: this server's /login/saml/acs) holds SAMLResponse; a browser's script
    posts it, `_post_form` does here.
    """
    response = await client.get(start)
    assert "loginuserpass" in response.url.path, f"not the provider's login page: {response.url}"
    return await _post_form(client, response, username=login, password=f"pass-of-{login}")


async def sign_in_at_saml_provider(
    client: aiohttp.ClientSession, login: str, start: str = "/login/saml"
) -> aiohttp.ClientResponse:
    """Sign login in through the provider and come back: the page signing in led to (or the refusal)."""
    return await _post_form(client, await answer_of_saml_provider(client, login, start))
