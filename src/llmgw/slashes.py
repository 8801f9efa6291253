"""A path with a trailing slash, or with slashes doubled, leads where the plain path does.

aiohttp's normalize_path_middleware did this for the listeners with two faults.
With slashes merged and removed, it also tried the path less its last
character whether or not that was a slash: DELETE /api/v1/models/m/bench was
redirected to /api/v1/models/m/benc, a model of that name, and a path one
letter too long redirected to its neighbour. And a method the plain path does
not take was a 404 (TRACE /admin/) where the plain path answers a 405.
"""

from __future__ import annotations

import re

from aiohttp import web
from aiohttp.typedefs import Handler

_SLASHES = re.compile("//+")


@web.middleware
async def plain_paths(request: web.Request, handler: Handler) -> web.StreamResponse:
    """A 308 to the plain path when it is a route, or its 405 when it takes other methods.

    Before the body is read: a redirect is answered without it.
    """
    if request.match_info.http_exception is None:
        return await handler(request)
    raw, question, query = request.raw_path.partition("?")
    # One leading slash, always: "//evil.example" must not become a redirect to another host.
    plain = _SLASHES.sub("/", raw)
    if len(plain) > 1:
        plain = plain.rstrip("/") or "/"
    if plain == raw:
        return await handler(request)
    found = await request.app.router.resolve(request.clone(rel_url=plain))
    if found.http_exception is None:
        raise web.HTTPPermanentRedirect(plain + question + query)
    if isinstance(found.http_exception, web.HTTPMethodNotAllowed):
        raise found.http_exception
    return await handler(request)
