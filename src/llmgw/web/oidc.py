"""Sign-in to the pages through the organisation's OpenID Connect provider (auth.oidc in server.yaml).

The authorization code flow with PKCE: /login/oidc sends the browser to the provider with a
fresh state, nonce and code verifier, which it also keeps in a short-lived HttpOnly cookie of
its own; /login/oidc/callback takes the browser back, refuses a state that is not the cookie's,
trades the code (with the client secret and the verifier) for an ID token at the provider's
token endpoint, and checks that token's signature against the provider's published keys (JWKS),
its issuer, audience, expiry (within a bounded clock skew) and nonce. The session it then makes
is the one a password sign-in makes.

The cookie rather than memory holds what the callback needs, so that several control planes
behind one address need nothing shared: it is bound to the browser that started, which is what
state and PKCE are for. Who the person is and what they may do is read from the token at every
sign-in (provider_accounts.py).
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import importlib
import json
import os
import secrets
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, urlencode

import aiohttp
import attrs
import structlog

from llmgw import strictjson
from llmgw.config.classes import OidcConfig
from llmgw.store.base import Store
from llmgw.store.users import User
from llmgw.web.provider_accounts import Mapping, SignInRefused
from llmgw.web.provider_accounts import sign_in as provider_sign_in

if TYPE_CHECKING:
    # joserfc is imported where a token or a key set is read: loaded at start, its modules held 1.5 MB
    # of every server's memory, signed in with OIDC or not.
    from joserfc.jwk import KeySet

log = structlog.get_logger(__name__)

FLOW_COOKIE = "llmgw_oidc"
CALLBACK_PATH = "/login/oidc/callback"
# How long a person may spend at the provider's pages between leaving and coming back.
FLOW_TTL_S = 600
# The signature algorithms an ID token may use: asymmetric only, so that the client secret is
# never also a signing key (and "none" is never accepted).
ALGORITHMS = ("RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512", "EdDSA")
# The most of a provider's answer (discovery, keys, token) that is read: a real one is a few KiB.
MAX_ANSWER = 1024 * 1024
# The provider's keys are fetched again at most this often for a token naming a key not yet seen.
JWKS_REFRESH_S = 30.0


class OidcError(SignInRefused):
    """A sign-in through the provider that cannot go on, in a sentence for the person signing in."""


def read_secret(cfg: OidcConfig) -> str:
    """The client secret, from its file or its environment variable; OidcError when neither has one.

    Also where the settings the flow cannot go without are checked, since this runs as the server starts.
    """
    for key in ("client_id", "base_url"):
        if not getattr(cfg, key):
            raise OidcError(f"auth.oidc.issuer is set but auth.oidc.{key} is empty; see docs/accounts.md")
    if cfg.client_secret_file:
        try:
            secret = Path(cfg.client_secret_file).read_text().strip()
        except OSError as exc:
            raise OidcError(f"cannot read auth.oidc.client_secret_file: {exc.strerror}") from None
    elif cfg.client_secret_env:
        secret = os.environ.get(cfg.client_secret_env, "").strip()
    else:
        secret = ""
    if not secret:
        raise OidcError(
            "auth.oidc has no client secret: set client_secret_file or client_secret_env "
            "to where the provider's secret for this client is kept"
        )
    return secret


async def _json_of(response: aiohttp.ClientResponse) -> Any:
    """The provider's answer as JSON, read up to MAX_ANSWER bytes: ValueError when longer or not JSON."""
    body = await response.content.read(MAX_ANSWER + 1)
    if len(body) > MAX_ANSWER:
        raise ValueError("longer than any answer of a provider")
    return json.loads(body)


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


@attrs.frozen
class Flow:
    """What the callback checks, kept in the browser's FLOW_COOKIE while the person is at the provider."""

    state: str
    nonce: str
    verifier: str
    next: str
    started: float

    def cookie(self) -> str:
        return _b64(strictjson.dumps(attrs.asdict(self)).encode())

    @classmethod
    def from_cookie(cls, text: str) -> Flow | None:
        try:
            data = json.loads(base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)))
            return cls(
                state=str(data["state"]),
                nonce=str(data["nonce"]),
                verifier=str(data["verifier"]),
                next=str(data["next"]),
                started=float(data["started"]),
            )
        except (ValueError, KeyError, TypeError):
            return None

    @classmethod
    def new(cls, next_path: str) -> Flow:
        return cls(
            state=secrets.token_urlsafe(32),
            nonce=secrets.token_urlsafe(32),
            verifier=secrets.token_urlsafe(48),
            next=next_path,
            started=time.time(),
        )

    def challenge(self) -> str:
        return _b64(hashlib.sha256(self.verifier.encode()).digest())


def verify_id_token(
    token: str, keys: KeySet, *, issuer: str, client_id: str, nonce: str, now: float, skew_s: float
) -> dict[str, Any]:
    """The claims of an ID token, once its signature, issuer, audience, times and nonce hold.

    OidcError, saying which did not, otherwise. jose_errors.InvalidKeyIdError is let through:
    the caller fetches the provider's keys again (they may have been rotated) and retries.
    """
    from joserfc import errors as jose_errors
    from joserfc import jwt

    try:
        decoded = jwt.decode(token, keys, algorithms=list(ALGORITHMS))
    except jose_errors.InvalidKeyIdError:
        raise
    except jose_errors.BadSignatureError:
        raise OidcError(
            "the provider's ID token is not signed by any of the provider's keys (its JWKS); it was refused"
        ) from None
    except (jose_errors.JoseError, ValueError) as exc:
        raise OidcError(f"the provider's ID token cannot be read ({exc})") from None
    claims = decoded.claims
    if claims.get("iss") != issuer:
        raise OidcError(f"the ID token was issued by {claims.get('iss')!r}, not by {issuer!r}")
    audience = claims.get("aud")
    audiences = audience if isinstance(audience, list) else [audience]
    if client_id not in audiences:
        raise OidcError(f"the ID token is for {audience!r}, not for this client ({client_id!r})")
    if len(audiences) > 1 and claims.get("azp") != client_id:
        raise OidcError("the ID token names several audiences and this client is not its authorized party")
    expires = claims.get("exp")
    if not isinstance(expires, (int, float)) or isinstance(expires, bool):
        raise OidcError("the ID token has no expiry (exp)")
    if now > expires + skew_s:
        raise OidcError(f"the ID token expired {int(now - expires)} s ago; sign in again")
    issued = claims.get("iat")
    if isinstance(issued, (int, float)) and issued > now + skew_s:
        raise OidcError(
            f"the ID token was issued {int(issued - now)} s in the future: the provider's clock and "
            "this server's differ by more than auth.oidc.clock_skew_s"
        )
    if not isinstance(claims.get("nonce"), str) or claims["nonce"] != nonce:
        raise OidcError("the ID token's nonce is not the one this sign-in sent; it was refused")
    return dict(claims)


@attrs.define
class Provider:
    """The provider auth.oidc names: its discovery document and keys, fetched once and kept."""

    cfg: OidcConfig
    secret: str = attrs.field(repr=False)
    _metadata: dict[str, Any] | None = None
    _keys: KeySet | None = None
    _keys_at: float = 0.0
    _lock: asyncio.Lock = attrs.field(factory=asyncio.Lock)
    # Wall-clock seconds that an ID token's times are judged by; tests move it instead of waiting.
    clock: Callable[[], float] = time.time

    @property
    def issuer(self) -> str:
        return self.cfg.issuer.rstrip("/")

    @property
    def redirect_uri(self) -> str:
        return self.cfg.base_url.rstrip("/") + CALLBACK_PATH

    def _timeout(self) -> aiohttp.ClientTimeout:
        return aiohttp.ClientTimeout(total=self.cfg.timeout_s)

    async def _get_json(self, url: str, what: str) -> dict[str, Any]:
        try:
            async with (
                aiohttp.ClientSession(timeout=self._timeout()) as http,
                http.get(url, headers={"Accept": "application/json"}) as response,
            ):
                if response.status != 200:
                    raise OidcError(
                        f"the identity provider answered {response.status} for its {what} ({url})"
                    )
                data = await _json_of(response)
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise OidcError(
                f"the identity provider at {self.issuer} did not answer for its {what} "
                f"({type(exc).__name__}{': ' + str(exc) if str(exc) else ''})"
            ) from None
        except ValueError:
            raise OidcError(f"the identity provider's {what} ({url}) is not JSON (or over 1 MiB)") from None
        if not isinstance(data, dict):
            raise OidcError(f"the identity provider's {what} ({url}) is not a JSON object")
        return data

    async def metadata(self) -> dict[str, Any]:
        """The discovery document; fetched until it has once been read, then kept."""
        async with self._lock:
            if self._metadata is None:
                data = await self._get_json(
                    f"{self.issuer}/.well-known/openid-configuration", "discovery document"
                )
                if str(data.get("issuer", "")).rstrip("/") != self.issuer:
                    raise OidcError(
                        f"the discovery document names the issuer {data.get('issuer')!r}, "
                        f"not auth.oidc.issuer ({self.issuer!r})"
                    )
                for needed in ("authorization_endpoint", "token_endpoint", "jwks_uri"):
                    if not isinstance(data.get(needed), str):
                        raise OidcError(f"the provider's discovery document has no {needed}")
                self._metadata = data
            return self._metadata

    async def keys(self, *, refresh: bool = False) -> KeySet:
        """The provider's public keys; refresh fetches them again (at most every JWKS_REFRESH_S)."""
        if "joserfc.jwt" not in sys.modules:
            # Its first use loads it, in a thread: some fifty modules read from disk would stall the loop.
            await asyncio.to_thread(importlib.import_module, "joserfc.jwt")
        from joserfc import errors as jose_errors
        from joserfc.jwk import KeySet

        metadata = await self.metadata()
        async with self._lock:
            stale = refresh and time.monotonic() - self._keys_at >= JWKS_REFRESH_S
            if self._keys is None or stale:
                data = await self._get_json(metadata["jwks_uri"], "keys (JWKS)")
                try:
                    self._keys = KeySet.import_key_set(data)  # type: ignore[arg-type]
                except (jose_errors.JoseError, ValueError, KeyError, TypeError) as exc:
                    raise OidcError(f"the provider's keys (JWKS) cannot be read ({exc})") from None
                self._keys_at = time.monotonic()
            return self._keys

    async def authorization_url(self, flow: Flow) -> str:
        metadata = await self.metadata()
        query = {
            "response_type": "code",
            "client_id": self.cfg.client_id,
            "redirect_uri": self.redirect_uri,
            "scope": " ".join(self.cfg.scopes),
            "state": flow.state,
            "nonce": flow.nonce,
            "code_challenge": flow.challenge(),
            "code_challenge_method": "S256",
        }
        endpoint = metadata["authorization_endpoint"]
        return f"{endpoint}{'&' if '?' in endpoint else '?'}{urlencode(query)}"

    def _basic(self) -> str:
        # client_secret_basic: each part form-encoded before base64 (RFC 6749, 2.3.1).
        pair = f"{quote(self.cfg.client_id, safe='')}:{quote(self.secret, safe='')}"
        return "Basic " + base64.b64encode(pair.encode()).decode()

    async def exchange(self, code: str, flow: Flow) -> dict[str, Any]:
        """The verified claims of the ID token the provider gives for code."""
        metadata = await self.metadata()
        form = {
            "grant_type": "authorization_code",
            "code": code,
            "redirect_uri": self.redirect_uri,
            "code_verifier": flow.verifier,
        }
        try:
            async with (
                aiohttp.ClientSession(timeout=self._timeout()) as http,
                http.post(
                    metadata["token_endpoint"],
                    data=form,
                    headers={"Accept": "application/json", "Authorization": self._basic()},
                ) as response,
            ):
                body = await _json_of(response)
                status = response.status
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise OidcError(
                f"the identity provider at {self.issuer} did not answer at its token endpoint "
                f"({type(exc).__name__})"
            ) from None
        except ValueError:
            raise OidcError("the identity provider's token endpoint did not answer with JSON") from None
        if status != 200 or not isinstance(body, dict):
            error = body.get("error", "") if isinstance(body, dict) else ""
            if error == "invalid_client":
                raise OidcError(
                    "the identity provider refused this server's client id or secret (invalid_client): "
                    "an administrator should check auth.oidc.client_id and the client secret"
                )
            raise OidcError(
                f"the identity provider refused the sign-in at its token endpoint ({error or status})"
            )
        token = body.get("id_token")
        if not isinstance(token, str):
            raise OidcError(
                "the identity provider's answer has no ID token (is `openid` in auth.oidc.scopes?)"
            )
        return await self.verify(token, flow.nonce)

    async def verify(self, token: str, nonce: str) -> dict[str, Any]:
        keys = await self.keys()
        from joserfc import errors as jose_errors

        check = {
            "issuer": self.issuer,
            "client_id": self.cfg.client_id,
            "nonce": nonce,
            "skew_s": self.cfg.clock_skew_s,
        }
        try:
            return verify_id_token(token, keys, now=self.clock(), **check)  # type: ignore[arg-type]
        except jose_errors.InvalidKeyIdError:
            pass
        # A key not seen yet: the provider may have rotated its keys since they were fetched.
        try:
            return verify_id_token(token, await self.keys(refresh=True), now=self.clock(), **check)  # type: ignore[arg-type]
        except jose_errors.InvalidKeyIdError:
            raise OidcError(
                "the provider's ID token is signed by a key the provider does not publish"
            ) from None

    async def logout_url(self, after: str) -> str | None:
        """The provider's end-session URL (RP-initiated logout), or None when it offers none."""
        try:
            endpoint = (await self.metadata()).get("end_session_endpoint")
        except OidcError:
            return None
        if not isinstance(endpoint, str):
            return None
        query = urlencode({"client_id": self.cfg.client_id, "post_logout_redirect_uri": after})
        return f"{endpoint}{'&' if '?' in endpoint else '?'}{query}"


def _groups_of(cfg: OidcConfig, claims: dict[str, Any]) -> tuple[str, ...]:
    raw = claims.get(cfg.groups_claim, [])
    return tuple(str(g) for g in raw) if isinstance(raw, list) else (str(raw),) if raw else ()


async def sign_in(store: Store, cfg: OidcConfig, claims: dict[str, Any]) -> User:
    """The account the ID token's claims name, made or brought up to date with what its groups give."""
    email = claims.get(cfg.email_claim)
    if not isinstance(email, str) or not email:
        raise OidcError(
            f"the provider did not say who you are: the ID token has no {cfg.email_claim!r} claim"
        )
    if cfg.email_claim == "email" and claims.get("email_verified") is False:
        raise OidcError(f"the provider has not verified the email {email}; verify it there first")
    mapping = Mapping(setting="auth.oidc", groups=cfg.groups, new_users=cfg.new_users, source="oidc")
    return await provider_sign_in(store, mapping, email, _groups_of(cfg, claims))
