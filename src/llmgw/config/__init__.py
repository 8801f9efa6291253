"""server.yaml, agent.yaml and mirror.yaml: declared once, read with file/line/key errors, documented.

classes.py declares every key with its default and help; loading.py reads a
file into those classes; location.py finds a key's line in a file;
reference.py writes docs/reference.md from the declarations (`make docs`);
database.py reads `database` when it names PostgreSQL (the store opens what
it checked, and sits above config: config never imports the store).
"""

from __future__ import annotations

from llmgw.config.classes import (
    AgentConfig,
    AuthConfig,
    ControlConfig,
    EndpointConfig,
    EngineMirrorConfig,
    EngineOptions,
    LogConfig,
    MirrorClientConfig,
    MirrorConfig,
    ModelConfig,
    MonitoringConfig,
    PriceConfig,
    ProbeConfig,
    ProfileConfig,
    ProvisionConfig,
    RouterConfig,
    ScaleConfig,
    ServerConfig,
    TimeoutsConfig,
    TLSConfig,
)
from llmgw.config.loading import check_flag, dump, evolve, load, parse
from llmgw.config.location import dotted, line_of, where
from llmgw.config.reference import documented_keys
from llmgw.config.yamltext import read_yaml

__all__ = [
    "AgentConfig",
    "AuthConfig",
    "ControlConfig",
    "EndpointConfig",
    "EngineMirrorConfig",
    "EngineOptions",
    "LogConfig",
    "MirrorClientConfig",
    "MirrorConfig",
    "ModelConfig",
    "MonitoringConfig",
    "PriceConfig",
    "ProbeConfig",
    "ProfileConfig",
    "ProvisionConfig",
    "RouterConfig",
    "ScaleConfig",
    "ServerConfig",
    "TLSConfig",
    "TimeoutsConfig",
    "check_flag",
    "documented_keys",
    "dotted",
    "dump",
    "evolve",
    "line_of",
    "load",
    "parse",
    "read_yaml",
    "where",
]
