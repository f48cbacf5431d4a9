"""deploy/k8s: every manifest parses, images and commands are consistent with the Dockerfiles and the CLI, and
the references between objects (Services, HPAs, ConfigMaps, PVCs, Secrets) resolve."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tests.deploy.common import DEPLOY, argv_of, fleetprof_invocations, parse_fleetprof

K8S = DEPLOY / "k8s"
MANIFESTS = sorted(p for p in K8S.glob("*.yaml") if p.name != "kustomization.yaml")
FLEETPROF_IMAGES = {"ghcr.io/fleetprof/server", "ghcr.io/fleetprof/server-slim", "ghcr.io/fleetprof/agent"}
WORKLOADS = {"Deployment", "DaemonSet", "StatefulSet", "Job"}


def _docs() -> list[tuple[Path, dict]]:
    out = []
    for path in MANIFESTS:
        for doc in yaml.safe_load_all(path.read_text()):
            if doc:
                out.append((path, doc))
    return out


DOCS = _docs()


def _objects(kind: str) -> dict[str, dict]:
    return {d["metadata"]["name"]: d for _, d in DOCS if d["kind"] == kind}


def _pod(doc: dict) -> dict:
    return doc["spec"]["template"]["spec"]


def _containers(doc: dict) -> list[dict]:
    pod = _pod(doc)
    return pod.get("initContainers", []) + pod["containers"]


def _invocations(container: dict) -> list[list[str]]:
    """The container's fleetprof command lines; with no `command`, the image's entrypoint applies (the agent
    image's is `fleetprof agent`, the server image's CMD is replaced by `command`)."""
    command, args = argv_of(container.get("command")), argv_of(container.get("args"))
    if not command and container["image"].startswith("ghcr.io/fleetprof/agent"):
        command = ["fleetprof", "agent"]
    return fleetprof_invocations(command + args)


def test_manifests_parse_and_live_in_the_namespace() -> None:
    assert {p.name for p in MANIFESTS} >= {"namespace.yaml", "config.yaml", "server.yaml", "worker.yaml",
                                          "dashboard.yaml", "migrate-job.yaml", "agent-daemonset.yaml"}
    for path, doc in DOCS:
        assert {"apiVersion", "kind", "metadata"} <= set(doc), path.name
        if doc["kind"] != "Namespace":
            assert doc["metadata"].get("namespace") == "fleetprof", f"{path.name}: {doc['metadata']['name']}"


@pytest.mark.parametrize("path_doc", [pd for pd in DOCS if pd[1]["kind"] in WORKLOADS],
                         ids=lambda pd: f"{pd[1]['kind']}/{pd[1]['metadata']['name']}")
def test_workload_images_and_commands(path_doc: tuple[Path, dict]) -> None:
    path, doc = path_doc
    for c in _containers(doc):
        repo, _, tag = c["image"].rpartition(":")
        assert tag and tag != "latest", f"{path.name}: pin the image tag of {c['name']}"
        if not repo.startswith("ghcr.io/fleetprof/"):
            continue
        assert repo in FLEETPROF_IMAGES, f"{path.name}: unknown image {c['image']}"
        invocations = _invocations(c)
        assert invocations, f"{path.name}: container {c['name']} runs no fleetprof command"
        for argv in invocations:
            args = parse_fleetprof(argv)
            if repo.endswith("/agent"):
                assert args.command == "agent"
            elif repo.endswith("/server-slim"):
                assert args.command == "dashboard", "only the dashboard runs the slim image (no torch)"
        # pod selectors match the template's labels
    selector = doc["spec"].get("selector", {}).get("matchLabels")
    if selector:
        labels = doc["spec"]["template"]["metadata"]["labels"]
        assert selector.items() <= labels.items(), f"{path.name}: selector does not match the pod labels"


def _fleetprof_commands() -> dict[str, list]:
    """workload name -> parsed fleetprof commands of its containers."""
    out: dict[str, list] = {}
    for _, doc in DOCS:
        if doc["kind"] in WORKLOADS:
            for c in _containers(doc):
                for argv in _invocations(c):
                    out.setdefault(doc["metadata"]["name"], []).append(parse_fleetprof(argv))
    return out


def test_server_deployment_probes_and_service() -> None:
    server = _objects("Deployment")["fleetprof-server"]
    (c,) = _pod(server)["containers"]
    (args,) = [parse_fleetprof(a) for a in _invocations(c)]
    assert args.command == "server" and args.host == "0.0.0.0"
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert ports["http"] == args.port
    assert c["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert c["livenessProbe"]["httpGet"]["path"] == "/healthz"
    for probe in ("readinessProbe", "livenessProbe"):
        assert c[probe]["httpGet"]["port"] in (args.port, "http")
    assert c["resources"]["requests"].get("cpu"), "an HPA on CPU needs a CPU request"
    env = {e["name"] for e in c.get("env", [])}
    assert "FLEETPROF_DATABASE_URL" in env
    service = _objects("Service")["fleetprof-server"]
    assert service["spec"]["selector"].items() <= server["spec"]["template"]["metadata"]["labels"].items()
    assert service["spec"]["ports"][0]["targetPort"] in ("http", args.port)


def test_services_select_some_workload() -> None:
    templates = [d["spec"]["template"]["metadata"]["labels"] for _, d in DOCS if d["kind"] in WORKLOADS]
    for name, svc in _objects("Service").items():
        sel = svc["spec"]["selector"]
        assert any(sel.items() <= labels.items() for labels in templates), f"Service {name} selects no pod"


def test_hpas_target_existing_deployments_with_cpu_requests() -> None:
    deployments = _objects("Deployment")
    hpas = _objects("HorizontalPodAutoscaler")
    assert "fleetprof-server" in {h["spec"]["scaleTargetRef"]["name"] for h in hpas.values()}
    for name, hpa in hpas.items():
        ref = hpa["spec"]["scaleTargetRef"]
        assert ref["kind"] == "Deployment" and ref["name"] in deployments, name
        assert ref["name"] != "fleetprof-beat", "beat must never be autoscaled"
        for c in _pod(deployments[ref["name"]])["containers"]:
            assert c["resources"]["requests"].get("cpu"), f"{ref['name']}: HPA on CPU needs a CPU request"


def test_exactly_one_beat_and_workers_without_it() -> None:
    commands = _fleetprof_commands()
    beats = [name for name, cmds in commands.items() for a in cmds if getattr(a, "beat", False)]
    assert beats == ["fleetprof-beat"], beats
    beat = _objects("Deployment")["fleetprof-beat"]
    assert beat["spec"]["replicas"] == 1
    assert beat["spec"]["strategy"]["type"] == "Recreate", "a rolling update would run two beats for a while"
    assert [a.command for a in commands["fleetprof-worker"]] == ["worker"]


def test_migration_job_upgrades_the_database() -> None:
    job = _objects("Job")["fleetprof-migrate"]
    assert _pod(job)["restartPolicy"] in ("Never", "OnFailure")
    (args,) = _fleetprof_commands()["fleetprof-migrate"]
    assert args.command == "db" and args.db_command == "upgrade"
    server_images = {c["image"] for c in _pod(_objects("Deployment")["fleetprof-server"])["containers"]}
    assert {c["image"] for c in _pod(job)["containers"]} <= server_images, "migrate with the server's release"


def test_references_resolve() -> None:
    configmaps, pvcs = _objects("ConfigMap"), _objects("PersistentVolumeClaim")
    readme = (DEPLOY / "README.md").read_text()
    for path, doc in DOCS:
        if doc["kind"] not in WORKLOADS:
            continue
        pod = _pod(doc)
        for vol in pod.get("volumes", []):
            if "persistentVolumeClaim" in vol:
                assert vol["persistentVolumeClaim"]["claimName"] in pvcs, path.name
        for c in _containers(doc):
            for src in c.get("envFrom", []):
                if "configMapRef" in src:
                    assert src["configMapRef"]["name"] in configmaps, path.name
            for env in c.get("env", []):
                ref = env.get("valueFrom", {}).get("secretKeyRef")
                if ref:
                    # secrets are created by hand (never committed): the README must say how
                    assert ref["name"] in readme, f"{path.name}: secret {ref['name']} is not documented"
            mounts = {m["name"] for m in c.get("volumeMounts", [])}
            assert mounts <= {v["name"] for v in pod.get("volumes", [])}, f"{path.name}: unknown volume mount"


def test_control_plane_shares_one_data_volume() -> None:
    claims = {}
    for name in ("fleetprof-server", "fleetprof-worker", "fleetprof-beat"):
        pod = _pod(_objects("Deployment")[name])
        claims[name] = {v["persistentVolumeClaim"]["claimName"] for v in pod["volumes"] if "persistentVolumeClaim" in v}
    assert len({frozenset(c) for c in claims.values()}) == 1 and claims["fleetprof-server"], claims
    (pvc,) = [_objects("PersistentVolumeClaim")[n] for n in claims["fleetprof-server"]]
    assert "ReadWriteMany" in pvc["spec"]["accessModes"], "several pods on several nodes write trace blobs"


def test_kustomization_lists_everything_but_the_migration_job() -> None:
    kust = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    assert set(kust["resources"]) == {p.name for p in MANIFESTS} - {"migrate-job.yaml"}
    used = {c["image"].rpartition(":")[0] for _, d in DOCS if d["kind"] in WORKLOADS for c in _containers(d)}
    named = {i["name"] for i in kust.get("images", [])}
    assert used & FLEETPROF_IMAGES <= named, "every fleetprof image is pinned in kustomization.yaml"
