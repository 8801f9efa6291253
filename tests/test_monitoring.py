"""The dashboard and alert rules in monitoring/: every query names only series llmgw exports."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import aiohttp
import pytest
from prometheus_client import CollectorRegistry
from ruamel.yaml import YAML
from structlog.testing import capture_logs

from llmgw.agent.discovery.gpus import GpuReading
from llmgw.agent.metrics import AgentMetrics
from llmgw.config import ServerConfig
from llmgw.metrics import Metrics
from llmgw.proto.llmgw import v1 as pb
from llmgw.roles.server import server_role
from tests import needs
from tests.servers import loopback_server_config

MONITORING = Path(__file__).parent.parent / "monitoring"
DASHBOARD = MONITORING / "grafana-dashboard.json"
ALERTS = MONITORING / "alerts.yml"
# Series Prometheus makes itself for every target; alert rules may use them.
PROMETHEUS_OWN = frozenset({"up"})
_KEYWORDS = frozenset(
    {"and", "or", "unless", "bool", "offset", "by", "without", "on", "ignoring", "group_left", "group_right"}
)
_GROUPING = re.compile(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")


def metric_names(expr: str) -> set[str]:
    """The series names a PromQL expression selects (not its functions, labels or keywords)."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'', "", expr)
    text = re.sub(r"\{[^}]*\}", " ", text)
    text = re.sub(r"\[[^\]]*\]", " ", text)
    text = _GROUPING.sub(" ", text)
    names = set()
    for match in _NAME.finditer(text):
        rest = text[match.end() :].lstrip()
        preceding = text[: match.start()]
        if rest.startswith("(") or match.group() in _KEYWORDS or (preceding and preceding[-1].isdigit()):
            continue
        names.add(match.group())
    return names


def _exported(page: str) -> set[str]:
    names = set()
    for line in page.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split()
            names.add(name)
            if kind == "histogram":
                names |= {f"{name}_bucket", f"{name}_sum", f"{name}_count"}
    return names


@pytest.fixture
def server_cfg(tmp_path: Path) -> ServerConfig:
    return loopback_server_config(
        tmp_path,
    )


@pytest.fixture
async def exported(server_cfg: ServerConfig) -> set[str]:
    """Every name on a server's page and on an agent's with a GPU: what dashboards may query."""
    with capture_logs():
        async with (
            server_role(server_cfg) as server,
            aiohttp.ClientSession() as session,
            session.get(f"{server.admin_url}/metrics") as reply,
        ):
            server_page = await reply.text()
    gpu = pb.Gpu(index=0, gpu_class="h100-80g", memory_total_mb=81559, memory_used_mb=1, healthy=True)
    agent = AgentMetrics(
        CollectorRegistry(),
        "n1",
        engines=list,
        restarts=dict,
        installs=list,
        downloaded=lambda: 0,
        gpus=lambda: [gpu],
        gpu_readings=lambda: {0: GpuReading(50.0, 60.0)},
        targets=list,
    )
    agent_page = await Metrics(agent.registry, [agent.state, agent.engine_pages]).page()
    return _exported(server_page) | _exported(agent_page.decode())


def _dashboard_queries() -> list[str]:
    dashboard = json.loads(DASHBOARD.read_text())
    return [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]


def _alert_queries() -> list[str]:
    rules = YAML(typ="safe").load(ALERTS.read_text())
    return [rule["expr"] for group in rules["groups"] for rule in group["rules"]]


class TestQueries:
    def test_the_name_finder_sees_series_and_not_functions_labels_or_ranges(self):
        expr = (
            'histogram_quantile(0.95, sum by (le, model) (rate(llmgw_x_bucket{model=~"a|b"}[5m])))'
            " / on (model) group_left llmgw_y offset 1h > bool 2 and ignoring (job) llmgw_z"
        )
        assert metric_names(expr) == {"llmgw_x_bucket", "llmgw_y", "llmgw_z"}

    async def test_every_dashboard_query_uses_only_names_llmgw_exports(self, exported: set[str]):
        queries = _dashboard_queries()
        assert len(queries) >= 20
        for expr in queries:
            unknown = metric_names(expr) - exported
            assert not unknown, f"{expr!r} queries {sorted(unknown)}, which llmgw does not export"

    async def test_every_alert_uses_only_names_llmgw_or_prometheus_exports(self, exported: set[str]):
        for expr in _alert_queries():
            unknown = metric_names(expr) - exported - PROMETHEUS_OWN
            assert not unknown, f"{expr!r} queries {sorted(unknown)}, which llmgw does not export"

    async def test_a_misspelt_name_would_be_caught(self, exported: set[str]):
        assert metric_names("rate(llmgw_request_total[5m])") - exported == {"llmgw_request_total"}

    def test_the_alert_rules_are_valid_for_prometheus(self):
        promtool = needs.program("promtool", "prometheus")
        checked = subprocess.run([promtool, "check", "rules", str(ALERTS)], capture_output=True, text=True)
        assert checked.returncode == 0, checked.stdout + checked.stderr
        assert "SUCCESS: 9 rules found" in checked.stdout
