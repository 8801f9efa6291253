"""What the pages need from the server, in one object the aiohttp apps hold under WEB_KEY."""

from __future__ import annotations

from collections.abc import Callable

import attrs
import jinja2
from aiohttp import web

from llmgw.config import ServerConfig
from llmgw.store import Store
from llmgw.store.scopes import Scope


@attrs.define
class WebContext:
    cfg: ServerConfig
    store: Store
    # What a running gateway counts as spent of a scope's budget this period;
    # None where the pages run without a gateway (tests of the pages alone).
    spent: Callable[[Scope], float | None] | None = None
    # Loaded in a thread when the app starts (reading templates would block the loop).
    templates: jinja2.Environment | None = None
    css: bytes = b""


WEB_KEY = web.AppKey("llmgw.web", WebContext)
# False on an app with no accounts (the admin listener: reaching it is the credential), whose
# pages must not offer a "Log in" or a profile that is not there.
ACCOUNTS_KEY = web.AppKey("llmgw.web.accounts", bool)
