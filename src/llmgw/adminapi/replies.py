"""The admin API's answers: a view, or a list of them, as JSON; an error as a sentence."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from llmgw import strictjson
from llmgw.adminapi import views


def reply(view: Any, status: int = 200) -> web.Response:
    """A view, or a list of them, as the JSON the API answers with."""
    return strictjson.response(views.CONVERTER.unstructure(view), status=status)


def error(status: int, message: str) -> web.Response:
    return reply(views.Error(error=message), status)
