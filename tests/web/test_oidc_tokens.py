"""The checks an ID token passes before it signs anyone in: signature, issuer, audience, times, nonce."""

from __future__ import annotations

import re
from typing import Any

import pytest
from joserfc import jwt
from joserfc.errors import InvalidKeyIdError
from joserfc.jwk import KeySet, RSAKey

from llmgw.web.oidc import OidcError, verify_id_token

ISSUER = "https://idp.example.com"
CLIENT = "llmgw"
NOW = 1_800_000_000.0
SKEW = 60.0

PROVIDER_KEY = RSAKey.generate_key(2048, parameters={"kid": "k1"}, private=True)
PUBLISHED = KeySet.import_key_set({"keys": [PROVIDER_KEY.as_dict(private=False)]})


def _token(key: RSAKey = PROVIDER_KEY, alg: str = "RS256", **changes: Any) -> str:
    claims: dict[str, Any] = {
        "iss": ISSUER,
        "aud": CLIENT,
        "sub": "ada",
        "iat": int(NOW),
        "exp": int(NOW) + 300,
        "nonce": "n-1",
    }
    claims.update(changes)
    claims = {name: value for name, value in claims.items() if value is not None}
    return jwt.encode({"alg": alg, "kid": key.kid}, claims, key)


def _verify(token: str, now: float = NOW, nonce: str = "n-1") -> dict[str, Any]:
    return verify_id_token(
        token, PUBLISHED, issuer=ISSUER, client_id=CLIENT, nonce=nonce, now=now, skew_s=SKEW
    )


def test_a_token_signed_by_the_providers_key_for_this_client_is_accepted() -> None:
    assert _verify(_token())["sub"] == "ada"


def test_a_token_signed_by_another_key_with_the_providers_key_id_is_refused() -> None:
    impostor = RSAKey.generate_key(2048, parameters={"kid": "k1"}, private=True)
    with pytest.raises(OidcError, match="not signed by any of the provider's keys"):
        _verify(_token(impostor))


def test_a_token_naming_a_key_not_published_asks_for_the_keys_again() -> None:
    rotated = RSAKey.generate_key(2048, parameters={"kid": "k2"}, private=True)
    with pytest.raises(InvalidKeyIdError):
        _verify(_token(rotated))


def test_a_token_for_another_audience_is_refused() -> None:
    with pytest.raises(OidcError, match="is for 'someone-else', not for this client"):
        _verify(_token(aud="someone-else"))


def test_a_token_from_another_issuer_is_refused() -> None:
    with pytest.raises(OidcError, match=re.escape("issued by 'https://evil.example.com'")):
        _verify(_token(iss="https://evil.example.com"))


def test_an_expired_token_is_refused_once_past_the_allowed_skew() -> None:
    token = _token()
    assert _verify(token, now=NOW + 300 + SKEW)["sub"] == "ada"
    with pytest.raises(OidcError, match="expired 61 s ago"):
        _verify(token, now=NOW + 300 + SKEW + 1)


def test_a_token_issued_further_in_the_future_than_the_skew_is_refused() -> None:
    with pytest.raises(OidcError, match="in the future"):
        _verify(_token(iat=int(NOW + SKEW + 5), exp=int(NOW + 600)))


def test_a_token_with_another_nonce_or_none_is_refused() -> None:
    with pytest.raises(OidcError, match="nonce is not the one this sign-in sent"):
        _verify(_token(), nonce="n-2")
    with pytest.raises(OidcError, match="nonce"):
        _verify(_token(nonce=None))


def test_a_token_without_expiry_is_refused() -> None:
    with pytest.raises(OidcError, match="no expiry"):
        _verify(_token(exp=None))


def test_an_unsigned_token_is_refused() -> None:
    # {"alg":"none","kid":"k1"}.{}.(no signature)
    with pytest.raises(OidcError, match="cannot be read"):
        _verify("eyJhbGciOiJub25lIiwia2lkIjoiazEifQ.e30.")
