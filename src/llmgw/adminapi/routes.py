"""A route, declared once: the aiohttp route and its OpenAPI operation are both made from it.

Before, the admin API's paths were written twice, as the handlers' route lists
and as a hand-written document beside them, and a page took six files to add.
Now each route of a listener is one `Route` in its table (adminapi/handlers.py,
adminapi/tenancy.py, adminapi/mirror.py, the pages in web/): `mount` adds the
table to an app, adminapi/openapi.py makes the document's paths from the same table.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any, Literal

import attrs
from aiohttp import web

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
Guard = Callable[[Handler], Handler]

_PLACEHOLDER = re.compile(r"\{(\w+)\}")


@attrs.frozen
class Param:
    """A path or query parameter: what the document says of it, and what aiohttp matches a path one with."""

    name: str
    where: Literal["path", "query"] = "path"
    description: str = ""
    schema: Mapping[str, Any] = attrs.field(factory=lambda: {"type": "string"})
    # A query parameter a route cannot do without (a path parameter always is one).
    required: bool = False
    # aiohttp's pattern for a path parameter, where one segment is not it (a model name holds slashes).
    pattern: str = ""

    def openapi(self) -> dict[str, Any]:
        described: dict[str, Any] = {"name": self.name, "in": self.where}
        if self.where == "path" or self.required:
            described["required"] = True
        if self.description:
            described["description"] = self.description
        described["schema"] = dict(self.schema)
        return described


@attrs.frozen
class Reply:
    """One status of a route: a sentence, and what the body holds.

    view is the attrs class of a JSON body (many: a list of it); html, a page; neither, a body
    the document does not describe (the document itself).
    """

    text: str
    view: type | None = None
    many: bool = False
    html: bool = False


@attrs.frozen
class Body:
    """What a route reads: a JSON view, or a schema per media type for a body that is not one."""

    view: type | None = None
    media: Mapping[str, Mapping[str, Any]] = attrs.field(factory=dict)
    required: bool = True


@attrs.frozen(kw_only=True)
class Route:
    """One route of a listener, as aiohttp serves it and as the admin API's document lists it."""

    method: str
    # The path as the document writes it, {name} for a parameter; Param.pattern says how aiohttp matches it.
    path: str
    handler: Handler
    summary: str
    # The document's operationId; None: not in the document (a file, or a page of the client port alone).
    operation: str | None = None
    description: str = ""
    parameters: tuple[Param, ...] = ()
    replies: Mapping[int, Reply] = attrs.field(factory=dict)
    body: Body | None = None
    # A page's entry in the administrators' navigation; "" for none.
    link: str = ""
    # Where the route is under a prefix, when not prefix + path: the root page, whose place under
    # /admin is /admin/cluster, since /admin itself is the administrators' own page.
    prefixed: str = ""

    def at(self, prefix: str) -> str:
        """The path under prefix ("" or "/admin"), as a person types it."""
        if prefix and self.prefixed:
            return prefix + self.prefixed
        return prefix + self.path

    def pattern(self, prefix: str) -> str:
        """The path under prefix as aiohttp matches it."""
        patterns = {p.name: p.pattern for p in self.parameters if p.where == "path" and p.pattern}

        def placeholder(match: re.Match[str]) -> str:
            name = match.group(1)
            return f"{{{name}:{patterns[name]}}}" if name in patterns else match.group(0)

        return _PLACEHOLDER.sub(placeholder, self.at(prefix))


def mount(
    app: web.Application,
    routes: Iterable[Route],
    *,
    prefix: str = "",
    guard: Guard | None = None,
    head: bool = False,
) -> None:
    """Add routes under prefix to app, each handler wrapped in guard; head: a GET answers HEAD too (pages)."""
    for route in routes:
        handler = guard(route.handler) if guard is not None else route.handler
        if head and route.method == "GET":
            app.router.add_get(route.pattern(prefix), handler)
        else:
            app.router.add_route(route.method, route.pattern(prefix), handler)
