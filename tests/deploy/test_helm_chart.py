"""deploy/helm/llmgw: lint-clean, valid for the Kubernetes versions still supported, on both stores."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
from click.testing import CliRunner
from kubernetes_validate import utils as kv_utils
from ruamel.yaml import YAML

from llmgw.cli.cert import cert

from .chart import CHART, NAMESPACE, POSTGRESQL, REPO, SQLITE, STORES, find, helm, refusal, template

# Kinds the Prometheus operator's CRDs add: kubernetes-validate has no schema for them.
_OPERATOR_KINDS = {"ServiceMonitor", "PodMonitor"}


def _supported_versions() -> list[str]:
    """The three newest minor releases kubernetes-validate knows: what upstream still supports."""
    versions = sorted(set(kv_utils.all_versions()), key=lambda v: tuple(int(p) for p in v.split(".")))
    return versions[-3:]


def _secrets(ca_dir: Path) -> list[dict[str, Any]]:
    runner = CliRunner()
    done = runner.invoke(cert, ["init-ca", "--dir", str(ca_dir)], catch_exceptions=False)
    assert done.exit_code == 0, done.output
    args = ["kubernetes-secrets", "--dir", str(ca_dir), "--node", "gpu-01"]
    done = runner.invoke(cert, args, catch_exceptions=False)
    assert done.exit_code == 0, done.output
    return [doc for doc in YAML(typ="safe").load_all(done.stdout) if doc]


def _pod_specs(docs: list[dict[str, Any]]) -> Iterator[tuple[str, dict[str, Any]]]:
    for doc in docs:
        if doc["kind"] in ("Deployment", "DaemonSet"):
            yield doc["metadata"]["name"], doc["spec"]["template"]["spec"]


def _config(docs: list[dict[str, Any]], name: str, key: str) -> dict[str, Any]:
    loaded: dict[str, Any] = YAML(typ="safe").load(find(docs, "ConfigMap", name)["data"][key])
    return loaded


@pytest.mark.parametrize("store", STORES)
def test_helm_lint_finds_nothing_to_say_on_either_store(store: str) -> None:
    """--strict: a warning fails as much as an error."""
    args = [a for k, v in STORES[store].items() for a in ("--set", f"{k}={v}")]
    done = helm("lint", "--strict", str(CHART), *args)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "[WARNING]" not in done.stdout and "[ERROR]" not in done.stdout, done.stdout


@pytest.mark.parametrize("version", _supported_versions())
@pytest.mark.parametrize("store", STORES)
def test_every_object_rendered_is_valid_for_each_kubernetes_version_still_supported(
    store: str, version: str, tmp_path: Path
) -> None:
    """Strict: a field Kubernetes does not know (a typo) fails as much as a wrong type.

    With the Secrets `llmgw cert kubernetes-secrets` writes, which the chart mounts by name.
    """
    docs = template(STORES[store]) + _secrets(tmp_path / "pki")
    for doc in docs:
        if doc["kind"] in _OPERATOR_KINDS:
            continue
        assert doc["metadata"]["namespace"] == NAMESPACE, doc["metadata"]["name"]
        try:
            kubernetes_validate.validate(doc, version, strict=True)
        except kubernetes_validate.ValidationError as err:
            raise AssertionError(f"{doc['kind']} {doc['metadata']['name']}: {err.message}") from None
    names = {doc["metadata"]["name"] for doc in docs if doc["kind"] == "Secret"}
    mounted = {
        v["secret"]["secretName"] for _, spec in _pod_specs(docs) for v in spec["volumes"] if "secret" in v
    }
    assert mounted <= names


class TestTheStores:
    def test_sqlite_is_one_server_replaced_by_recreate_with_its_store_on_a_kept_claim(self) -> None:
        docs = template(SQLITE)
        server = find(docs, "Deployment", "llmgw-server")
        assert server["spec"]["replicas"] == 1
        assert server["spec"]["strategy"] == {"type": "Recreate"}
        state = next(v for v in server["spec"]["template"]["spec"]["volumes"] if v["name"] == "state")
        claim = find(docs, "PersistentVolumeClaim", state["persistentVolumeClaim"]["claimName"])
        assert claim["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
        env = server["spec"]["template"]["spec"]["containers"][0]["env"]
        assert "LLMGW_DATABASE_URL" not in [e["name"] for e in env]

    def test_an_existing_claim_is_used_and_none_is_made(self) -> None:
        docs = template({**SQLITE, "database.sqlite.existingClaim": "old-state"})
        spec = find(docs, "Deployment", "llmgw-server")["spec"]["template"]["spec"]
        state = next(v for v in spec["volumes"] if v["name"] == "state")
        assert state["persistentVolumeClaim"]["claimName"] == "old-state"
        assert not [
            d for d in docs if d["kind"] == "PersistentVolumeClaim" and "server" in d["metadata"]["name"]
        ]

    def test_postgresql_is_two_servers_rolling_with_the_url_from_its_secret_and_no_claim(self) -> None:
        docs = template(POSTGRESQL)
        server = find(docs, "Deployment", "llmgw-server")
        assert server["spec"]["replicas"] == 2
        assert server["spec"]["strategy"]["type"] == "RollingUpdate"
        spec = server["spec"]["template"]["spec"]
        env = {e["name"]: e["valueFrom"]["secretKeyRef"] for e in spec["containers"][0]["env"]}
        assert env["LLMGW_DATABASE_URL"] == {"name": "llmgw-postgres", "key": "url"}
        assert next(v for v in spec["volumes"] if v["name"] == "state") == {"name": "state", "emptyDir": {}}
        assert "llmgw-server-state" not in [d["metadata"]["name"] for d in docs]
        # The URL holds a password: never in the ConfigMap.
        assert "database" not in _config(docs, "llmgw-server", "server.yaml")


class TestWrongValues:
    @pytest.mark.parametrize(
        ("values", "said"),
        [
            ({"server.replicas": "2"}, "at '/server/replicas': value must be 1"),
            (
                {"database.type": "postgresql", "server.replicas": "2"},
                "at '/database/url/secretName': minLength: got 0, want 1",
            ),
            (
                {"database.type": "postgresql", "database.url.secretName": "pg"},
                "at '/server/replicas': minimum: got 1, want 2",
            ),
            ({"database.type": "mysql"}, "at '/database/type': value must be one of 'sqlite', 'postgresql'"),
            ({"server.config.database": "x.db"}, "invalid propertyName 'database'"),
            ({"service.port": "70000"}, "at '/service/port': maximum: got 70,000, want 65,535"),
            ({"agent.enabled": "yes"}, "at '/agent/enabled': got string, want boolean"),
            ({"sever.replicas": "1"}, "additional properties 'sever' not allowed"),
        ],
    )
    def test_helm_refuses_a_wrong_value_naming_it_and_what_it_must_be(
        self, values: dict[str, str], said: str
    ) -> None:
        assert said in refusal(values)


class TestWhatIsRendered:
    @pytest.mark.parametrize("store", STORES)
    def test_every_container_has_requests_probes_and_runs_read_only_as_non_root_but_the_agent(
        self, store: str
    ) -> None:
        """The agent alone runs as root: it installs the OS packages its engines need."""
        for name, spec in _pod_specs(template(STORES[store])):
            for container in spec["containers"]:
                assert {"cpu", "memory"} <= set(container["resources"]["requests"]), name
                assert container["livenessProbe"]["httpGet"]["path"] in ("/health", "/metrics"), name
                assert container["readinessProbe"]["httpGet"], name
                assert container["securityContext"]["allowPrivilegeEscalation"] is False, name
                if name != "llmgw-agent":
                    assert spec["securityContext"]["runAsNonRoot"] is True, name
                    assert container["securityContext"]["readOnlyRootFilesystem"] is True, name

    def test_the_image_is_what_make_image_builds_unless_another_is_named(self) -> None:
        cases = [({}, "localhost/llmgw:latest"), ({"image.tag": "0.2.0"}, "localhost/llmgw:0.2.0")]
        for values, image in cases:
            for _, spec in _pod_specs(template({**SQLITE, **values})):
                assert spec["containers"][0]["image"] == image

    def test_the_agents_may_keep_their_image_while_the_servers_are_upgraded_first(self) -> None:
        docs = template({**SQLITE, "image.tag": "0.2.0", "agent.imageTag": "0.1.0"})
        images = {name: spec["containers"][0]["image"] for name, spec in _pod_specs(docs)}
        assert images == {
            "llmgw-server": "localhost/llmgw:0.2.0",
            "llmgw-mirror": "localhost/llmgw:0.2.0",
            "llmgw-agent": "localhost/llmgw:0.1.0",
        }

    def test_the_admin_listener_stays_on_the_pods_loopback_and_no_service_exposes_it(self) -> None:
        docs = template(SQLITE)
        assert _config(docs, "llmgw-server", "server.yaml")["admin_listen"].startswith("127.0.0.1:")
        ports = [p["port"] for d in docs if d["kind"] == "Service" for p in d["spec"]["ports"]]
        assert 9090 not in ports

    def test_the_admin_token_comes_from_its_secret_and_the_config_holds_none(self) -> None:
        docs = template(SQLITE)
        spec = find(docs, "Deployment", "llmgw-server")["spec"]["template"]["spec"]
        env = {e["name"]: e["valueFrom"]["secretKeyRef"] for e in spec["containers"][0]["env"]}
        assert env["LLMGW_ADMIN_TOKEN"] == {"name": "llmgw-admin-token", "key": "token"}
        assert "admin_tokens" not in _config(docs, "llmgw-server", "server.yaml")

    def test_values_in_server_config_reach_server_yaml_beside_what_the_chart_sets(self) -> None:
        docs = template({**SQLITE, "server.config.auth.default_rpm": "5"})
        config = _config(docs, "llmgw-server", "server.yaml")
        assert config["auth"]["default_rpm"] == 5
        assert config["listen"] == "0.0.0.0:8080"

    def test_the_agent_is_off_by_default_as_gpu_nodes_stay_outside(self) -> None:
        docs = template({})
        assert not [d for d in docs if "agent" in d["metadata"]["name"] and d["kind"] != "Service"]

    def test_the_agent_runs_on_gpu_nodes_with_the_nvidia_runtime_and_keeps_engines_and_weights_on_the_node(
        self,
    ) -> None:
        docs = template(SQLITE)
        spec = find(docs, "DaemonSet", "llmgw-agent")["spec"]["template"]["spec"]
        assert spec["runtimeClassName"] == "nvidia"
        assert spec["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
        host_paths = {v["hostPath"]["path"] for v in spec["volumes"] if "hostPath" in v}
        agent_yaml = _config(docs, "llmgw-agent", "agent.yaml")
        assert {agent_yaml["state_dir"], agent_yaml["weights_cache"]} <= {
            m["mountPath"] for m in spec["containers"][0]["volumeMounts"]
        }
        assert host_paths == {"/var/lib/llmgw-agent", "/var/lib/llmgw-weights"}
        # The agent Service's name, as the server's certificate carries it.
        assert agent_yaml["servers"] == ["llmgw-agents.llmgw.svc:7443"]

    def test_the_agents_runtime_class_node_selector_and_tolerations_are_values(self) -> None:
        values = {**SQLITE, "agent.runtimeClassName": "", "agent.nodeSelector.gpu": "a100"}
        spec = find(template(values), "DaemonSet", "llmgw-agent")["spec"]["template"]["spec"]
        assert "runtimeClassName" not in spec
        assert spec["nodeSelector"] == {"nvidia.com/gpu.present": "true", "gpu": "a100"}

    def test_pods_carry_prometheus_annotations_on_the_port_their_metrics_listen_names(self) -> None:
        docs = template(SQLITE)
        for kind, name, key in (
            ("Deployment", "llmgw-server", "server.yaml"),
            ("DaemonSet", "llmgw-agent", "agent.yaml"),
        ):
            annotations = find(docs, kind, name)["spec"]["template"]["metadata"]["annotations"]
            assert annotations["prometheus.io/scrape"] == "true"
            assert _config(docs, name, key)["metrics_listen"].endswith(
                ":" + annotations["prometheus.io/port"]
            )

    def test_a_changed_server_yaml_changes_the_pods_so_an_upgrade_restarts_them(self) -> None:
        def checksum(values: dict[str, str]) -> str:
            server = find(template(values), "Deployment", "llmgw-server")
            return str(server["spec"]["template"]["metadata"]["annotations"]["checksum/config"])

        assert checksum(SQLITE) != checksum({**SQLITE, "server.config.auth.default_rpm": "5"})

    def test_the_monitors_select_the_gateways_service_and_the_agents_by_ports_they_have(self) -> None:
        docs = template(SQLITE)
        monitor, service = find(docs, "ServiceMonitor", "llmgw"), find(docs, "Service", "llmgw")
        assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
        assert monitor["spec"]["endpoints"][0]["port"] in [p["name"] for p in service["spec"]["ports"]]
        pods = find(docs, "PodMonitor", "llmgw-agent")
        agent = find(docs, "DaemonSet", "llmgw-agent")["spec"]["template"]
        assert pods["spec"]["selector"]["matchLabels"].items() <= agent["metadata"]["labels"].items()
        assert pods["spec"]["podMetricsEndpoints"][0]["port"] in [
            p["name"] for p in agent["spec"]["containers"][0]["ports"]
        ]

    def test_without_the_prometheus_operator_no_monitor_is_rendered(self) -> None:
        """Its kinds would be refused by a cluster without the operator's CRDs."""
        kinds = {d["kind"] for d in template(SQLITE, api_versions=())}
        assert not kinds & _OPERATOR_KINDS

    def test_the_ingress_sends_its_host_to_the_gateway_with_tls_from_the_secret_named(self) -> None:
        ingress = find(template({**SQLITE, "ingress.host": "ai.example.org"}), "Ingress", "llmgw")
        assert ingress["spec"]["tls"] == [{"hosts": ["ai.example.org"], "secretName": "llmgw-ingress-tls"}]
        backend = ingress["spec"]["rules"][0]["http"]["paths"][0]["backend"]["service"]
        assert backend == {"name": "llmgw", "port": {"name": "gateway"}}


def _leaves(schema: dict[str, Any], prefix: str = "") -> Iterator[str]:
    """Every value's dotted path: objects with properties of their own are walked, not listed."""
    properties = schema.get("properties")
    if properties and not prefix.endswith(".config"):
        for key, sub in properties.items():
            yield from _leaves(sub, f"{prefix}.{key}" if prefix else key)
    else:
        yield prefix


def test_every_value_the_schema_holds_is_in_values_yaml_and_described_in_the_docs() -> None:
    schema = json.loads((CHART / "values.schema.json").read_text())
    values = YAML(typ="safe").load((CHART / "values.yaml").read_text())
    table = (REPO / "docs" / "kubernetes.md").read_text().split("## 10. Every value", 1)[1]
    documented = set(re.findall(r"^\| `([^`]+)` \|", table, re.MULTILINE))
    paths = {path for path in _leaves(schema) if path != "global"}  # global: helm's own
    assert documented == paths
    for path in paths:
        node = values
        for part in path.split("."):
            assert part in node, f"{path} is in the schema but not in values.yaml"
            node = node[part]
