"""Sign-in to the pages through the organisation's SAML 2.0 identity provider (auth.saml in server.yaml).

The Web Browser SSO profile, with pysaml2: /login/saml sends the browser to the provider's single
sign-on service with an AuthnRequest (HTTP-Redirect binding), keeping the request's ID in a
short-lived cookie of its own; the provider posts its signed Response back to /login/saml/acs
(HTTP-POST binding), where pysaml2 checks the signature (of the response or of its assertion)
against the certificate in the provider's metadata, the audience (this server's entity id), the
assertion's time conditions and that the response answers the request this browser sent
(InResponseTo, which the spent cookie makes good once). What the person may do is then read from
their groups as for OpenID Connect (provider_accounts.py).

pysaml2 checks signatures by running xmlsec1 and reads files as it goes: every call into it runs
in a thread, never on the event loop. It is imported only where SAML is set up: it takes most of
a second to import, which every other start of llmgw would pay for nothing.
"""

from __future__ import annotations

import asyncio
import base64
import json
import shutil
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import aiohttp
import attrs

from llmgw import strictjson
from llmgw.config.classes import SamlConfig
from llmgw.store.base import Store
from llmgw.store.users import User
from llmgw.web.provider_accounts import Mapping, SignInRefused
from llmgw.web.provider_accounts import sign_in as provider_sign_in

if TYPE_CHECKING:
    from saml2.config import SPConfig

FLOW_COOKIE = "llmgw_saml"
ACS_PATH = "/login/saml/acs"
METADATA_PATH = "/login/saml/metadata"
# How long a person may spend at the provider's pages between leaving and coming back.
FLOW_TTL_S = 600
# The most of a provider's metadata that is read from its URL: real ones are tens of KiB.
MAX_METADATA = 4 * 1024 * 1024
# How far the provider's clock may be from this one when judging an assertion's times.
CLOCK_SKEW_S = 60


class SamlError(SignInRefused):
    """A sign-in through the SAML provider that cannot go on, in a sentence for the person signing in."""


@attrs.frozen
class SamlFlow:
    """What the answer is checked against, kept in the browser's FLOW_COOKIE while it is at the provider."""

    request_id: str
    next: str
    started: float

    def cookie(self) -> str:
        return base64.urlsafe_b64encode(strictjson.dumps(attrs.asdict(self)).encode()).decode()

    @classmethod
    def from_cookie(cls, text: str) -> SamlFlow | None:
        try:
            data = json.loads(base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)))
            return cls(
                request_id=str(data["request_id"]), next=str(data["next"]), started=float(data["started"])
            )
        except (ValueError, KeyError, TypeError):
            return None


async def read_metadata(cfg: SamlConfig, timeout_s: float = 10.0) -> str:
    """The provider's metadata, from its file or its URL; SamlError saying why it cannot be had."""
    source = cfg.idp_metadata
    if source.startswith(("http://", "https://")):
        try:
            async with (
                aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout_s)) as http,
                http.get(source) as response,
            ):
                body = await response.content.read(MAX_METADATA + 1)
                if response.status != 200:
                    raise SamlError(f"auth.saml.idp_metadata ({source}) answered {response.status}")
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise SamlError(
                f"the identity provider did not answer for its metadata at {source} ({type(exc).__name__})"
            ) from None
        if len(body) > MAX_METADATA:
            raise SamlError(f"auth.saml.idp_metadata ({source}) is longer than any provider's metadata")
        return body.decode("utf-8", "replace")
    try:
        return await asyncio.to_thread(Path(source).read_text)
    except OSError as exc:
        raise SamlError(f"cannot read auth.saml.idp_metadata ({source}): {exc.strerror}") from None


def _sp_config(cfg: SamlConfig, metadata: str) -> SPConfig:
    """pysaml2's settings: signed answers to this server's own requests only."""
    from saml2 import BINDING_HTTP_POST
    from saml2.config import SPConfig

    xmlsec = shutil.which("xmlsec1")
    if xmlsec is None:
        raise SamlError("auth.saml needs the xmlsec1 program to check signatures (apt-get install xmlsec1)")
    base = cfg.base_url.rstrip("/")
    settings: dict[str, Any] = {
        "entityid": cfg.entity_id or base + METADATA_PATH,
        "xmlsec_binary": xmlsec,
        "metadata": {"inline": [metadata]},
        "accepted_time_diff": CLOCK_SKEW_S,
        "allow_unknown_attributes": True,
        "service": {
            "sp": {
                "endpoints": {"assertion_consumer_service": [(base + ACS_PATH, BINDING_HTTP_POST)]},
                # Okta signs the response, Entra ID the assertion, Keycloak either: one must be.
                "want_assertions_or_response_signed": True,
                "want_response_signed": False,
                "want_assertions_signed": False,
                "allow_unsolicited": False,
                "authn_requests_signed": False,
            }
        },
    }
    config = SPConfig()
    try:
        config.load(settings)
    except Exception as exc:  # pysaml2 raises plain exceptions for metadata it cannot use
        raise SamlError(
            f"the identity provider's metadata (auth.saml.idp_metadata) cannot be used: {exc}"
        ) from None
    if not config.metadata.identity_providers():
        raise SamlError("auth.saml.idp_metadata describes no identity provider (no IDPSSODescriptor)")
    return config


def _refusal(exc: Exception, entity_id: str) -> str:
    """What went wrong with the provider's answer, for the person signing in."""
    from saml2.response import IncorrectlySigned, StatusError, UnsolicitedResponse
    from saml2.sigver import SignatureError, SigverError
    from saml2.validate import ResponseLifetimeExceed, ToEarly

    if isinstance(exc, (SignatureError, SigverError, IncorrectlySigned)):
        return (
            "the identity provider's answer is not signed by the key its metadata names "
            "(auth.saml.idp_metadata); it was refused"
        )
    if isinstance(exc, UnsolicitedResponse):
        return "the answer is not for the sign-in this browser started, so it was refused; start again"
    if isinstance(exc, (ResponseLifetimeExceed, ToEarly)):
        return "the identity provider's answer is out of its time (expired, or not valid yet); sign in again"
    if isinstance(exc, StatusError):
        return f"the identity provider said: {str(exc)[:200]}"
    if "AudienceRestrictions" in str(exc):
        return f"the identity provider's answer is for another service provider, not for {entity_id}"
    return f"the identity provider's answer cannot be used ({type(exc).__name__}: {str(exc)[:200]})"


@attrs.define
class ServiceProvider:
    """This server as auth.saml describes it, with the provider's metadata read once at start."""

    cfg: SamlConfig
    config: SPConfig

    @classmethod
    async def load(cls, cfg: SamlConfig) -> ServiceProvider:
        if not cfg.base_url:
            raise SamlError(
                "auth.saml.idp_metadata is set but auth.saml.base_url is empty; see docs/accounts.md"
            )
        metadata = await read_metadata(cfg)
        return cls(cfg, await asyncio.to_thread(_sp_config, cfg, metadata))

    @property
    def entity_id(self) -> str:
        return str(self.config.entityid)

    async def authn_request(self) -> tuple[str, str]:
        """A new AuthnRequest: its ID and the provider's URL that carries it."""

        def prepare() -> tuple[str, str]:
            from saml2 import BINDING_HTTP_REDIRECT
            from saml2.client import Saml2Client

            request_id, info = Saml2Client(self.config).prepare_for_authenticate(
                binding=BINDING_HTTP_REDIRECT, relay_state=""
            )
            return str(request_id), str(dict(info["headers"])["Location"])

        return await asyncio.to_thread(prepare)

    async def identity(self, saml_response: str, request_id: str) -> tuple[str, tuple[str, ...]]:
        """The person's email and groups from a verified answer to request_id; SamlError otherwise."""

        def parse() -> Any:
            from saml2 import BINDING_HTTP_POST
            from saml2.client import Saml2Client

            return Saml2Client(self.config).parse_authn_request_response(
                saml_response, BINDING_HTTP_POST, outstanding={request_id: ""}
            )

        try:
            response = await asyncio.to_thread(parse)
        except Exception as exc:  # pysaml2 raises plain exceptions for several refusals
            raise SamlError(_refusal(exc, self.entity_id)) from None
        if response is None:
            raise SamlError("the identity provider's answer cannot be read")
        attributes = response.get_identity() or {}
        if self.cfg.email_attribute:
            values = attributes.get(self.cfg.email_attribute) or []
            email = str(values[0]) if values else ""
        else:
            email = str(response.get_subject().text or "")
        if not email:
            raise SamlError(
                "the provider did not say who you are: the assertion has no "
                f"{self.cfg.email_attribute or 'NameID'!r} attribute"
            )
        groups = tuple(str(g) for g in attributes.get(self.cfg.groups_attribute) or [])
        return email, groups

    async def metadata(self) -> str:
        """This server's metadata, for the provider's administrator to register it from."""
        from saml2.metadata import create_metadata_string

        document = await asyncio.to_thread(create_metadata_string, None, config=self.config)
        return document.decode() if isinstance(document, bytes) else str(document)

    async def sign_in(self, store: Store, email: str, groups: tuple[str, ...]) -> User:
        mapping = Mapping(
            setting="auth.saml", groups=self.cfg.groups, new_users=self.cfg.new_users, source="saml"
        )
        return await provider_sign_in(store, mapping, email, groups)


def flow_for(request_id: str, next_path: str) -> SamlFlow:
    return SamlFlow(request_id=request_id, next=next_path, started=time.time())
