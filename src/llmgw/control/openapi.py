"""The OpenAPI 3.1 document of the admin API, served at /api/v1/openapi.json.

Written by hand, next to nothing else: a test holds that every route the admin
app serves is in it, and that it is a valid OpenAPI document, so it cannot
drift from the code unnoticed.
"""

from __future__ import annotations

from typing import Any


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def _json(schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


_ERROR = _json(_ref("Error"), "What went wrong, in a sentence.")
_NODE_ID = {
    "name": "id",
    "in": "path",
    "required": True,
    "description": "The node's id: its certificate's common name.",
    "schema": {"type": "string"},
}


def _nullable(schema: dict[str, Any]) -> dict[str, Any]:
    return {"oneOf": [schema, {"type": "null"}]}


_STRINGS = {"type": "array", "items": {"type": "string"}}


def _page(operation: str, summary: str, parameters: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """An HTML page of the admin app, listed so that the document covers every route."""
    get: dict[str, Any] = {
        "operationId": operation,
        "summary": summary,
        "tags": ["pages"],
        "responses": {
            "200": {"description": "HTML.", "content": {"text/html": {"schema": {"type": "string"}}}}
        },
    }
    if parameters:
        get["parameters"] = parameters
    return {"get": get}


_SCHEMAS: dict[str, Any] = {
    "Error": {
        "type": "object",
        "required": ["error"],
        "properties": {"error": {"type": "string", "description": "A sentence for a person."}},
    },
    "Status": {
        "type": "object",
        "required": ["version", "nodes", "models", "replicas"],
        "properties": {
            "version": {"type": "string"},
            "nodes": {
                "type": "object",
                "description": "How many nodes are in each state, and in all.",
                "additionalProperties": {"type": "integer"},
            },
            "models": {
                "type": "object",
                "properties": {"total": {"type": "integer"}, "serving": {"type": "integer"}},
            },
            "replicas": {
                "type": "object",
                "properties": {"total": {"type": "integer"}, "ready": {"type": "integer"}},
            },
        },
    },
    "Node": {
        "type": "object",
        "required": ["id", "state", "admin_state", "connected", "replicas"],
        "description": "A null value means the node has not reported it, which is not the same as none.",
        "properties": {
            "id": {"type": "string"},
            "state": {
                "type": "string",
                "enum": ["ready", "cordoned", "draining", "disconnected", "unreachable"],
            },
            "admin_state": {"type": "string", "enum": ["ready", "cordoned", "draining"]},
            "connected": {"type": "boolean"},
            "reachable": {"type": "boolean"},
            "address": {"type": "string"},
            "agent_version": {"type": "string"},
            "gpus": _nullable(
                {
                    "type": "object",
                    "properties": {
                        "total": {"type": "integer"},
                        "free": {"type": "integer"},
                        "healthy": {"type": "integer"},
                    },
                }
            ),
            "memory": _nullable(
                {
                    "type": "object",
                    "properties": {"total_mb": {"type": "integer"}, "available_mb": {"type": "integer"}},
                }
            ),
            "disk": _nullable(
                {
                    "type": "object",
                    "properties": {"total_bytes": {"type": "integer"}, "free_bytes": {"type": "integer"}},
                }
            ),
            "engines": _nullable(_STRINGS),
            "classes": _STRINGS,
            "fabrics": _nullable(_STRINGS),
            "models": _STRINGS,
            "replicas": {"type": "integer"},
            "last_seen_s": _nullable({"type": "number", "description": "Seconds since the node was heard."}),
            "unhealthy": _STRINGS,
            "host": _nullable(_ref("Host")),
            "provision": {
                "type": "array",
                "items": _ref("Install"),
                "description": "Every engine the node was asked to install, and where each stands.",
            },
            "installs_not_ready": {
                "type": "array",
                "items": _ref("Install"),
                "description": "The installs in provision that are not ready.",
            },
            "warnings": {
                **_STRINGS,
                "description": 'What slows the machine down without making it unhealthy: "no AVX2: ...".',
            },
        },
    },
    "Host": {
        "type": "object",
        "description": "The machine as the agent read it at start.",
        "properties": {
            "os_id": {"type": "string", "description": 'From /etc/os-release: "ubuntu".'},
            "os_version": {"type": "string", "description": '"24.04".'},
            "os_codename": {"type": "string", "description": '"noble"; empty where the OS has none.'},
            "family": {"type": "string", "description": '"deb", "rpm", or empty when unknown.'},
            "arch": {"type": "string", "description": 'In Debian\'s spelling: "amd64", "arm64".'},
            "cpu_flags": {
                **_STRINGS,
                "description": "The vector extensions inference cares about that the CPU has.",
            },
            "nvidia_driver": {"type": "string", "description": "The driver's version; empty when none."},
        },
    },
    "Install": {
        "type": "object",
        "properties": {
            "engine": {"type": "string"},
            "version": {"type": "string"},
            "variant": {"type": "string"},
            "state": {"type": "string", "enum": ["installing", "ready", "failed", "unsupported"]},
            "detail": {"type": "string"},
        },
    },
    "Replica": {
        "type": "object",
        "required": ["shard_id", "model", "node", "state"],
        "properties": {
            "shard_id": {"type": "string"},
            "model": {"type": "string"},
            "node": {"type": "string"},
            "engine": {"type": "string"},
            "profile": {"type": "string"},
            "state": {"type": "string"},
            "endpoint": {"type": "string"},
            "detail": {"type": "string"},
        },
    },
    "Model": {
        "type": "object",
        "required": ["name", "wanted", "ready", "replicas"],
        "properties": {
            "name": {"type": "string"},
            "wanted": {"type": "integer"},
            "ready": {"type": "integer"},
            "engines": _STRINGS,
            "replicas": {"type": "array", "items": _ref("Replica")},
            "why_not_ready": _nullable({"type": "string"}),
        },
    },
    "Placement": {
        "type": "object",
        "required": ["model", "candidates"],
        "properties": {
            "model": {"type": "string"},
            "candidates": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {
                        "profile": {"type": "string"},
                        "node": {"type": "string"},
                        "candidate": {"type": "boolean"},
                        "reason": {
                            "type": "string",
                            "description": 'Follows the node\'s name: "is cordoned".',
                        },
                    },
                },
            },
            "why_not_ready": _nullable({"type": "string"}),
        },
    },
    "Logs": {
        "type": "object",
        "required": ["node", "source", "lines", "sources", "error"],
        "properties": {
            "node": {"type": "string"},
            "source": {"type": "string"},
            "lines": {**_STRINGS, "description": "Oldest first."},
            "sources": {**_STRINGS, "description": '"agent", and one per engine the node runs.'},
            "error": {"type": "string", "description": "Empty, or why there are no lines."},
        },
    },
    "NodeState": {
        "type": "object",
        "required": ["state"],
        "properties": {"state": {"type": "string", "enum": ["ready", "cordoned", "draining"]}},
    },
}


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
            "schemas": _SCHEMAS,
            "securitySchemes": {"adminToken": {"type": "http", "scheme": "bearer"}},
        },
        "paths": {
            "/api/v1/status": {
                "get": {
                    "operationId": "status",
                    "summary": "How many nodes, models and replicas, in which state.",
                    "responses": {"200": _json(_ref("Status"), "The cluster at a glance.")},
                }
            },
            "/api/v1/nodes": {
                "get": {
                    "operationId": "nodes",
                    "summary": "Every node that registered since the control plane started.",
                    "responses": {"200": _json({"type": "array", "items": _ref("Node")}, "Nodes, by id.")},
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
                            "schema": {"type": "integer", "minimum": 1, "maximum": 2000, "default": 300},
                        },
                    ],
                    "responses": {
                        "200": _json(_ref("Logs"), "The lines, oldest first, and the node's sources."),
                        "400": _ERROR,
                        "404": _json(_ref("Logs"), "No such node, or no such source on it."),
                        "502": _json(_ref("Logs"), "The node is not connected."),
                        "504": _json(_ref("Logs"), "The node did not answer within 10 s."),
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
                        "content": {"application/json": {"schema": _ref("NodeState")}},
                    },
                    "responses": {
                        "200": _json(_ref("Node"), "The node, in its new state."),
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
                    "responses": {"200": _json({"type": "array", "items": _ref("Model")}, "The catalog.")},
                },
                "post": {
                    "operationId": "addModel",
                    "summary": "Add a model to the catalog, or replace one added before; kept over restarts.",
                    "description": "The body is one model's definition, as under `models:` in server.yaml "
                    "(docs/reference.md), YAML or JSON. A name server.yaml declares is refused (409).",
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
                        "200": _json(_ref("Model"), "It replaced the model of that name added before."),
                        "201": _json(_ref("Model"), "It was added."),
                        "400": _json(_ref("Error"), "The definition cannot be used: what, at which line."),
                        "409": _ERROR,
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
                            "description": "The model's name; it may hold slashes.",
                            "schema": {"type": "string"},
                        }
                    ],
                    "responses": {
                        "200": _json(
                            {
                                "type": "object",
                                "properties": {"name": {"type": "string"}, "removed": {"type": "boolean"}},
                            },
                            "It was removed.",
                        ),
                        "404": _ERROR,
                        "409": _json(_ref("Error"), "server.yaml declares it; ctl removes only its own."),
                    },
                }
            },
            "/api/v1/replicas": {
                "get": {
                    "operationId": "replicas",
                    "summary": "Every replica, or those of one model.",
                    "parameters": [{"name": "model", "in": "query", "schema": {"type": "string"}}],
                    "responses": {"200": _json({"type": "array", "items": _ref("Replica")}, "Replicas.")},
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
                        "200": _json(
                            {
                                "type": "object",
                                "required": ["shard_id", "model", "node", "engine", "url", "metrics"],
                                "properties": {
                                    "shard_id": {"type": "string"},
                                    "model": {"type": "string"},
                                    "node": {"type": "string"},
                                    "engine": {"type": "string"},
                                    "url": {"type": "string", "description": "The page that was read."},
                                    "metrics": {
                                        "type": "object",
                                        "description": 'Sample name, labels as in `n{l="v"}`, -> value.',
                                        "additionalProperties": {"type": "number"},
                                    },
                                },
                            },
                            "The engine's metrics.",
                        ),
                        "404": _ERROR,
                        "502": _json(_ref("Error"), "The engine has no address yet or did not answer."),
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
                        "200": _json(_ref("Placement"), "One verdict per node."),
                        "400": _ERROR,
                        "404": _ERROR,
                    },
                }
            },
            "/": _page("cluster", "The cluster page: every node, its resources, engines and replicas."),
            "/models": _page("modelsPage", "Each model, its replicas, where they run and their state."),
            "/nodes/{id}/logs": _page(
                "nodeLogsPage",
                "One of a node's logs: a tab per source, 100 to 2000 lines, following every 5 s.",
                [
                    _NODE_ID,
                    {"name": "source", "in": "query", "schema": {"type": "string", "default": "agent"}},
                    {
                        "name": "lines",
                        "in": "query",
                        "schema": {"type": "integer", "enum": [100, 300, 1000, 2000]},
                    },
                    {"name": "follow", "in": "query", "schema": {"type": "string", "enum": ["1"]}},
                ],
            ),
            "/api/v1/weights/collect": {
                "post": {
                    "operationId": "collectWeights",
                    "summary": "Ask every node to remove weights no catalog model uses, never any in use.",
                    "responses": {
                        "200": _json(
                            {
                                "type": "object",
                                "properties": {
                                    "nodes": {
                                        "type": "array",
                                        "items": {
                                            "type": "object",
                                            "properties": {
                                                "node": {"type": "string"},
                                                "removing": {"type": "array", "items": {"type": "string"}},
                                                "kept": {"type": "array", "items": {"type": "string"}},
                                                "error": {"type": "string"},
                                            },
                                        },
                                    }
                                },
                            },
                            "What each node was asked to remove, and what it keeps.",
                        )
                    },
                }
            },
            "/api/v1/openapi.json": {
                "get": {
                    "operationId": "openapi",
                    "summary": "This document.",
                    "responses": {"200": {"description": "The OpenAPI document."}},
                }
            },
        },
    }
