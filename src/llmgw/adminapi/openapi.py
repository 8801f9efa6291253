"""The OpenAPI 3.1 document of the admin API, served at /api/v1/openapi.json.

What is per route is written here: paths, parameters, status codes. What a
reply holds is not: its schema is generated from the view the handler returns
(adminapi/views.py, adminapi/schema.py). Tests hold that every route the admin
app serves is listed here and that every reply validates against the document.
"""

from __future__ import annotations

from typing import Any

from llmgw.adminapi import tenancy_doc, views
from llmgw.adminapi.present import LOG_PAGE_FOLLOW_S, LOG_PAGE_LINES
from llmgw.adminapi.schema import components, ref
from llmgw.control.nodelogs import ANSWER_TIMEOUT_S, DEFAULT_LINES, MAX_LINES
from llmgw.mirror import admin as mirror_admin
from llmgw.tenancy import views as tenancy_views


def _json(schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def _array(items: dict[str, Any]) -> dict[str, Any]:
    return {"type": "array", "items": items}


_ERROR = _json(ref(views.Error), "What went wrong, in a sentence.")
_NODE_ID = {
    "name": "id",
    "in": "path",
    "required": True,
    "description": "The node's id: its certificate's common name.",
    "schema": {"type": "string"},
}


def _html(description: str) -> dict[str, Any]:
    return {"description": description, "content": {"text/html": {"schema": {"type": "string"}}}}


def _page(
    operation: str,
    summary: str,
    parameters: list[dict[str, Any]] | None = None,
    refusals: dict[str, dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """An HTML page of the admin app, listed so that the document covers every route."""
    get: dict[str, Any] = {
        "operationId": operation,
        "summary": summary,
        "tags": ["pages"],
        "responses": {"200": _html("HTML."), **(refusals or {})},
    }
    if parameters:
        get["parameters"] = parameters
    return {"get": get}


def document(version: str) -> dict[str, Any]:
    """The admin API's OpenAPI document."""
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "llmgw admin API",
            "version": version,
            "description": "Served on the admin listener (`admin_listen`, this machine only) and under "
            "/admin on the client port, where it needs an admin token (`admin_tokens`) or session.",
        },
        "components": {
            "schemas": components((*views.SHAPES, *tenancy_views.SHAPES, *mirror_admin.SHAPES)),
            "securitySchemes": {"adminToken": {"type": "http", "scheme": "bearer"}},
        },
        "paths": {
            "/api/v1/status": {
                "get": {
                    "operationId": "status",
                    "summary": "How many nodes, models and replicas, in which state.",
                    "responses": {"200": _json(ref(views.Status), "The cluster at a glance.")},
                }
            },
            "/api/v1/nodes": {
                "get": {
                    "operationId": "nodes",
                    "summary": "Every node that registered since the control plane started.",
                    "responses": {"200": _json(_array(ref(views.Node)), "Nodes, by id.")},
                }
            },
            "/api/v1/nodes/{id}/logs": {
                "get": {
                    "operationId": "nodeLogs",
                    "summary": "The newest lines of one of a node's logs, asked of the node over its stream.",
                    "parameters": [
                        _NODE_ID,
                        {
                            "name": "source",
                            "in": "query",
                            "description": '"agent" (the default), or a shard id for that engine\'s output.',
                            "schema": {"type": "string", "default": "agent"},
                        },
                        {
                            "name": "lines",
                            "in": "query",
                            "description": "How many of the newest lines.",
                            "schema": {
                                "type": "integer",
                                "minimum": 1,
                                "maximum": MAX_LINES,
                                "default": DEFAULT_LINES,
                            },
                        },
                    ],
                    "responses": {
                        "200": _json(ref(views.Logs), "The lines, oldest first, and the node's sources."),
                        "400": _ERROR,
                        "404": _json(ref(views.Logs), "No such node, or no such source on it."),
                        "502": _json(ref(views.Logs), "The node is not connected."),
                        "504": _json(
                            ref(views.Logs), f"The node did not answer within {ANSWER_TIMEOUT_S:g} s."
                        ),
                    },
                }
            },
            "/api/v1/nodes/{id}/state": {
                "post": {
                    "operationId": "setNodeState",
                    "summary": "Cordon or drain a node (no new replicas go there), or make it ready again.",
                    "parameters": [_NODE_ID],
                    "requestBody": {
                        "required": True,
                        "content": {"application/json": {"schema": ref(views.StateChange)}},
                    },
                    "responses": {
                        "200": _json(ref(views.Node), "The node, in its new state."),
                        "400": _ERROR,
                        "404": _ERROR,
                        "415": _ERROR,
                    },
                }
            },
            "/api/v1/models": {
                "get": {
                    "operationId": "models",
                    "summary": "Every catalog model, its replicas, where they run and their state.",
                    "responses": {"200": _json(_array(ref(views.Model)), "The catalog.")},
                },
                "post": {
                    "operationId": "addModel",
                    "summary": "Add a model to the catalog, or replace one added before; kept over restarts.",
                    "description": "The body is one model's definition, as under `models:` in server.yaml "
                    "(docs/reference.md), YAML or JSON, at most 1 MiB (413). A name server.yaml declares is "
                    "refused (409).",
                    "parameters": [
                        {
                            "name": "file",
                            "in": "query",
                            "description": "The definition's file name, which errors name with the line.",
                            "schema": {"type": "string"},
                        }
                    ],
                    "requestBody": {
                        "required": True,
                        "content": {
                            "application/yaml": {"schema": {"type": "string"}},
                            "application/json": {"schema": {"type": "object"}},
                        },
                    },
                    "responses": {
                        "200": _json(ref(views.Model), "It replaced the model of that name added before."),
                        "201": _json(ref(views.Model), "It was added."),
                        "400": _json(ref(views.Error), "The definition cannot be used: what, at which line."),
                        "409": _ERROR,
                        "413": _json(ref(views.Error), "The definition is over 1 MiB."),
                        "415": _ERROR,
                    },
                },
            },
            "/api/v1/models/{name}": {
                "delete": {
                    "operationId": "removeModel",
                    "summary": "Remove a model added with `llmgw ctl model add`; its replicas are stopped.",
                    "parameters": [
                        {
                            "name": "name",
                            "in": "path",
                            "required": True,
                            "description": (
                                "The model's name, URL-encoded as one segment (org%2Fmodel); "
                                "a bare slash is accepted too."
                            ),
                            "schema": {"type": "string"},
                        }
                    ],
                    "responses": {
                        "200": _json(ref(views.Removed), "It was removed."),
                        "404": _ERROR,
                        "409": _json(ref(views.Error), "server.yaml declares it; ctl removes only its own."),
                    },
                }
            },
            "/api/v1/replicas": {
                "get": {
                    "operationId": "replicas",
                    "summary": "Every replica, or those of one model.",
                    "parameters": [{"name": "model", "in": "query", "schema": {"type": "string"}}],
                    "responses": {"200": _json(_array(ref(views.Replica)), "Replicas.")},
                }
            },
            "/api/v1/replicas/{shard_id}/metrics": {
                "get": {
                    "operationId": "replicaMetrics",
                    "summary": "The replica's engine's own metrics page, read now and parsed into numbers.",
                    "parameters": [
                        {
                            "name": "shard_id",
                            "in": "path",
                            "required": True,
                            "description": "The replica, as `GET /api/v1/replicas` names it.",
                            "schema": {"type": "string"},
                        }
                    ],
                    "responses": {
                        "200": _json(ref(views.ReplicaMetrics), "The engine's metrics."),
                        "404": _ERROR,
                        "502": _json(ref(views.Error), "The engine has no address yet or did not answer."),
                    },
                }
            },
            "/api/v1/explain-placement": {
                "get": {
                    "operationId": "explainPlacement",
                    "summary": "Per node, whether the model's next replica could go there, and why.",
                    "parameters": [
                        {"name": "model", "in": "query", "required": True, "schema": {"type": "string"}}
                    ],
                    "responses": {
                        "200": _json(ref(views.Placement), "One verdict per node."),
                        "400": _ERROR,
                        "404": _ERROR,
                    },
                }
            },
            "/": _page("cluster", "The cluster page: every node, its resources, engines and replicas."),
            "/models": _page("modelsPage", "Each model, its replicas, where they run and their state."),
            "/nodes/{id}/logs": _page(
                "nodeLogsPage",
                f"One of a node's logs: a tab per source, {LOG_PAGE_LINES[0]} to {LOG_PAGE_LINES[-1]} lines, "
                f"following every {LOG_PAGE_FOLLOW_S} s.",
                [
                    _NODE_ID,
                    {"name": "source", "in": "query", "schema": {"type": "string", "default": "agent"}},
                    {
                        "name": "lines",
                        "in": "query",
                        "description": f"How many of the newest lines; the page offers {LOG_PAGE_LINES}.",
                        "schema": {
                            "type": "integer",
                            "minimum": 1,
                            "maximum": MAX_LINES,
                            "default": DEFAULT_LINES,
                        },
                    },
                    {
                        "name": "follow",
                        "in": "query",
                        "description": "1: reload every few seconds.",
                        "schema": {"type": "string", "enum": ["1"]},
                    },
                ],
                {
                    "400": _html("A lines or follow the page cannot show, in a sentence."),
                    "404": _html("No such node: the page says so."),
                },
            ),
            "/api/v1/weights/collect": {
                "post": {
                    "operationId": "collectWeights",
                    "summary": "Ask every node to remove weights no catalog model uses, never any in use.",
                    "description": "Send Content-Type: application/json (an empty object will do; the "
                    "body is not read): without it a page elsewhere could make this change through a "
                    "browser.",
                    "requestBody": {
                        "required": False,
                        "content": {"application/json": {"schema": {"description": "Not read."}}},
                    },
                    "responses": {
                        "200": _json(
                            ref(views.Collected), "What each node was asked to remove, and what it keeps."
                        ),
                        "415": _ERROR,
                    },
                }
            },
            # The mirror's admin API, relayed (control/mirror.py); 404 where no mirror is configured.
            **_mirror_paths(),
            "/api/v1/openapi.json": {
                "get": {
                    "operationId": "openapi",
                    "summary": "This document.",
                    "responses": {"200": {"description": "The OpenAPI document."}},
                }
            },
            # Organisations, teams, projects, members, quotas and prices.
            **tenancy_doc.paths(),
        },
    }


def _mirror_paths() -> dict[str, Any]:
    relayed = "Relayed to the mirror's admin listener; 404 where server.yaml names no mirror, 502 where it "
    gone = _json(ref(views.Error), "No mirror is configured (or, for one fetch or model, no such one).")
    unreachable = _json(ref(views.Error), "The mirror cannot be reached.")
    model = {
        "name": "model",
        "in": "query",
        "required": True,
        "description": "REPO@REVISION: a commit, or the revision the model was fetched as.",
        "schema": {"type": "string"},
    }
    return {
        "/api/v1/mirror/models": {
            "get": {
                "operationId": "mirrorModels",
                "summary": "The models on the mirror, their files, sizes and pins. "
                + relayed
                + "cannot be reached.",
                "responses": {
                    "200": _json(ref(mirror_admin.MirrorModels), "The models."),
                    "404": gone,
                    "502": unreachable,
                },
            },
            "delete": {
                "operationId": "mirrorRemoveModel",
                "summary": "Delete a model from the mirror. " + relayed + "cannot be reached.",
                "parameters": [model],
                "responses": {
                    "200": _json(ref(mirror_admin.MirrorRemoved), "What was deleted."),
                    "400": _ERROR,
                    "404": gone,
                    "409": _json(ref(views.Error), "The model is being fetched."),
                    "502": unreachable,
                },
            },
        },
        "/api/v1/mirror/fetches": {
            "get": {
                "operationId": "mirrorFetches",
                "summary": "The mirror's fetches, newest first. " + relayed + "cannot be reached.",
                "responses": {
                    "200": _json(ref(mirror_admin.MirrorFetches), "The fetches."),
                    "404": gone,
                    "502": unreachable,
                },
            },
            "post": {
                "operationId": "mirrorFetch",
                "summary": 'Start a fetch: {"model": "REPO[@REVISION]", "include": ["GLOB"]}. '
                + relayed
                + "cannot be reached.",
                "responses": {
                    "202": _json(ref(mirror_admin.Fetch), "The fetch, running."),
                    "400": _ERROR,
                    "404": gone,
                    "415": _json(ref(views.Error), "The body is not JSON (Content-Type: application/json)."),
                    "502": unreachable,
                },
            },
        },
        "/api/v1/mirror/fetches/{id}": {
            "get": {
                "operationId": "mirrorFetchProgress",
                "summary": "One fetch: its state, progress, error or model. "
                + relayed
                + "cannot be reached.",
                "parameters": [
                    {
                        "name": "id",
                        "in": "path",
                        "required": True,
                        "description": "The fetch's id.",
                        "schema": {"type": "string"},
                    }
                ],
                "responses": {
                    "200": _json(ref(mirror_admin.Fetch), "The fetch."),
                    "404": gone,
                    "502": unreachable,
                },
            }
        },
        "/mirror": _page(
            "mirrorPage",
            "The models on the mirror and its fetches (where a mirror is configured).",
            refusals={"404": _html("No mirror is configured (server.yaml's `mirror.api`).")},
        ),
    }
