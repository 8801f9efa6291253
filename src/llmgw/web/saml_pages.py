"""/login/saml, its assertion consumer service and this server's metadata: the pages' side of saml.py.

Every refusal is the sign-in page with the reason above it (oidc_pages.refused), the local
sign-in under it where it is kept.
"""

from __future__ import annotations

import time

from aiohttp import web

from llmgw.bodies import read_fields
from llmgw.web.account import _local, _see_other
from llmgw.web.context import WEB_KEY
from llmgw.web.oidc_pages import no_sign_in_under_way, refused, session_for
from llmgw.web.provider_accounts import SignInRefused
from llmgw.web.saml import FLOW_COOKIE, FLOW_TTL_S, SamlError, SamlFlow, flow_for
from llmgw.web.sessions import clear_cookie, set_cookie

_NONE = "this server has no SAML identity provider set up (auth.saml)"


async def start(request: web.Request) -> web.StreamResponse:
    """Send the browser to the provider with an AuthnRequest, keeping its ID in FLOW_COOKIE."""
    provider = request.config_dict[WEB_KEY].saml
    target = _local(request.query.get("next", "/profile"))
    if provider is None:
        return await refused(request, _NONE, 404, target)
    request_id, location = await provider.authn_request()
    response = _see_other(location)
    set_cookie(
        response,
        request,
        FLOW_COOKIE,
        flow_for(request_id, target).cookie(),
        max_age=FLOW_TTL_S,
        cross_site_post=True,
    )
    return response


async def acs(request: web.Request) -> web.StreamResponse:
    """Check the provider's posted answer, and sign the person in with a session of the pages.

    No CSRF token here: the provider's page posts this form, and what binds it to this browser is
    the request ID in FLOW_COOKIE that the signed answer must name. Whatever the outcome, the
    cookie is spent, so that the same answer is taken once.
    """
    response = await _answer(request)
    clear_cookie(response, request, FLOW_COOKIE, cross_site_post=True)
    return response


async def _answer(request: web.Request) -> web.StreamResponse:
    ctx = request.config_dict[WEB_KEY]
    provider = ctx.saml
    if provider is None:
        return await refused(request, _NONE, 404)
    flow = SamlFlow.from_cookie(request.cookies.get(FLOW_COOKIE, ""))
    if flow is None or time.time() - flow.started > FLOW_TTL_S:
        return await no_sign_in_under_way(request, FLOW_TTL_S)
    answer = (await read_fields(request)).get("SAMLResponse", "")
    if not answer:
        return await refused(request, "the provider's answer has no SAMLResponse", 400, flow.next)
    try:
        email, groups = await provider.identity(answer, flow.request_id)
        user = await provider.sign_in(ctx.store, email, groups)
    except (SamlError, SignInRefused) as exc:
        return await refused(request, str(exc), 401, flow.next)
    return await session_for(request, user, flow.next)


async def metadata(request: web.Request) -> web.StreamResponse:
    """This server's SAML metadata (entity id, assertion consumer service), to register it at the provider."""
    provider = request.config_dict[WEB_KEY].saml
    if provider is None:
        return await refused(request, _NONE, 404)
    return web.Response(text=await provider.metadata(), content_type="application/samlmetadata+xml")
