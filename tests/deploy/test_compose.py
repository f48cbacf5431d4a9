"""docker-compose.yml: accepted by Docker Compose, and every service runs a real `fleetprof` command line."""

from __future__ import annotations

import shutil
import subprocess

import pytest
import yaml

from tests.deploy.common import (
    COMPOSE_FILE,
    REPO_ROOT,
    argv_of,
    dockerfile_stages,
    fleetprof_invocations,
    interpolate,
    parse_fleetprof,
)

CONTROL_PLANE = ("postgres", "redis", "server", "worker", "beat", "dashboard")


def _compose_cli() -> list[str] | None:
    """`docker compose` (v2 plugin) if it works, else the standalone `docker-compose`, else None."""
    if shutil.which("docker"):
        probe = subprocess.run(["docker", "compose", "version"], capture_output=True, text=True)
        if probe.returncode == 0:
            return ["docker", "compose"]
    if shutil.which("docker-compose"):
        return ["docker-compose"]
    return None


@pytest.fixture(scope="module")
def compose() -> dict:
    """The file as Compose reads it: YAML anchors and merge keys resolved, ${VAR:-default} interpolated with
    an empty environment (what a fresh checkout gets)."""
    return interpolate(yaml.safe_load(COMPOSE_FILE.read_text()))


@pytest.fixture(scope="module")
def services(compose: dict) -> dict:
    return compose["services"]


def _invocations(svc: dict) -> list[list[str]]:
    argv = argv_of(svc.get("entrypoint")) + argv_of(svc.get("command"))
    return fleetprof_invocations(argv)


def _runs_fleetprof_image(svc: dict) -> bool:
    return "fleetprof" in str(svc.get("image", ""))


@pytest.mark.parametrize("profile", [None, "gpu"])
def test_docker_compose_config_accepts_the_file(profile: str | None) -> None:
    cli = _compose_cli()
    if cli is None:
        pytest.fail("neither `docker compose` nor `docker-compose` is installed: `make test` installs docker-compose")
    cmd = cli + ["-f", str(COMPOSE_FILE)] + (["--profile", profile] if profile else []) + ["config"]
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO_ROOT, timeout=120,
                          env={"PATH": "/usr/local/bin:/usr/bin:/bin"})
    assert done.returncode == 0, f"{' '.join(cmd)} failed:\n{done.stderr}"
    rendered = yaml.safe_load(done.stdout)
    expected = set(CONTROL_PLANE) | ({"agent", "agent-token"} if profile else set())
    assert expected <= set(rendered["services"])


def test_control_plane_and_gpu_agent_are_defined(services: dict) -> None:
    for name in CONTROL_PLANE:
        assert name in services, f"service {name} missing"
        assert not services[name].get("profiles"), f"{name} must start by default, not under a profile"
    agent = services["agent"]
    assert agent.get("profiles") == ["gpu"]
    devices = agent["deploy"]["resources"]["reservations"]["devices"]
    assert any(d.get("driver") == "nvidia" for d in devices), "the agent must reserve NVIDIA devices"
    assert agent.get("pid") == "host", "NVML reports host pids: the agent needs the host pid namespace"


def test_every_fleetprof_service_runs_a_real_subcommand(services: dict) -> None:
    seen = {}
    for name, svc in services.items():
        if not _runs_fleetprof_image(svc):
            continue
        invocations = _invocations(svc)
        assert invocations, f"service {name} runs a fleetprof image but no `fleetprof` command"
        for argv in invocations:
            args = parse_fleetprof(argv)
            seen.setdefault(name, []).append(args.command)
    assert seen["server"] == ["db", "server"], "the server migrates (db upgrade) and then serves"
    assert seen["worker"] == ["worker"] and seen["beat"] == ["worker"]
    assert seen["dashboard"] == ["dashboard"]
    assert seen["agent"] == ["agent"]


def test_server_migrates_first_and_listens_on_all_interfaces(services: dict) -> None:
    db, serve = _invocations(services["server"])
    assert parse_fleetprof(db).db_command == "upgrade"
    args = parse_fleetprof(serve)
    assert args.host == "0.0.0.0"
    published = [str(p) for p in services["server"].get("ports", [])]
    assert any(p.endswith(f":{args.port}") for p in published), published
    script = argv_of(services["server"]["command"])[-1]
    assert script.index("db upgrade") < script.index("&&") < script.index("fleetprof server"), \
        "the server must start only if the migration succeeded"
    assert "/healthz" in " ".join(argv_of(services["server"]["healthcheck"]["test"]))


def test_exactly_one_beat(services: dict) -> None:
    beats = [name for name, svc in services.items()
             if any(getattr(parse_fleetprof(a), "beat", False) for a in _invocations(svc))]
    assert beats == ["beat"], f"exactly one service may run beat, found {beats}"
    beat = services["beat"]
    assert beat.get("deploy", {}).get("replicas", 1) == 1
    args = parse_fleetprof(_invocations(beat)[0])
    assert args.concurrency == 1


def test_control_plane_environment(services: dict) -> None:
    for name in ("server", "worker", "beat", "agent-token"):
        env = services[name]["environment"]
        assert env["FLEETPROF_ENVIRONMENT"] == "production", name
        assert env["FLEETPROF_DATABASE_URL"].startswith("postgresql+psycopg2://"), name
        assert "@postgres:5432/" in env["FLEETPROF_DATABASE_URL"], name
        assert env["FLEETPROF_BROKER_URL"].startswith("redis://redis:6379"), name
    # every process that reads or writes trace blobs shares one data volume
    mounts = {name: {str(v).split(":")[0] for v in services[name].get("volumes", [])}
              for name in ("server", "worker", "beat")}
    assert mounts["server"] == mounts["worker"] == mounts["beat"] and mounts["server"], mounts
    dash_env = services["dashboard"]["environment"]
    serve = parse_fleetprof(_invocations(services["server"])[1])
    assert dash_env["FLEETPROF_SERVER_URL"] == f"http://server:{serve.port}"
    assert "FLEETPROF_TOKEN" not in dash_env, "a shared dashboard must not carry a default token"
    assert "FLEETPROF_DATABASE_URL" not in dash_env, "the dashboard reads data only through the REST API"


def test_dependencies_and_healthchecks(services: dict) -> None:
    assert "pg_isready" in " ".join(argv_of(services["postgres"]["healthcheck"]["test"]))
    assert services["server"]["depends_on"]["postgres"]["condition"] == "service_healthy"
    assert services["server"]["depends_on"]["redis"]["condition"] == "service_healthy"
    for name, svc in services.items():
        deps = svc.get("depends_on", {})
        for dep, cond in (deps.items() if isinstance(deps, dict) else ((d, {}) for d in deps)):
            assert dep in services, f"{name} depends on unknown service {dep}"
            if cond.get("condition") == "service_healthy":
                assert "healthcheck" in services[dep], f"{name} waits for {dep} to be healthy, which has no healthcheck"
            if not svc.get("profiles"):
                assert not services[dep].get("profiles"), f"default service {name} depends on profiled {dep}"


def test_builds_and_volumes_exist(compose: dict, services: dict) -> None:
    declared = set(compose.get("volumes") or {})
    for name, svc in services.items():
        build = svc.get("build")
        if build:
            dockerfile = REPO_ROOT / build.get("context", ".") / build["dockerfile"]
            assert dockerfile.is_file(), f"{name}: {dockerfile} missing"
            if "target" in build:
                assert build["target"] in dockerfile_stages(dockerfile), f"{name}: no stage {build['target']}"
        for vol in svc.get("volumes", []):
            source = str(vol).split(":")[0]
            if not source.startswith((".", "/")):
                assert source in declared, f"{name} mounts undeclared volume {source}"


def test_images_match_the_kubernetes_manifests(services: dict) -> None:
    k8s_images = set()
    for path in (REPO_ROOT / "deploy" / "k8s").glob("*.yaml"):
        for doc in yaml.safe_load_all(path.read_text()):
            spec = (doc or {}).get("spec", {})
            pod = spec.get("template", {}).get("spec", {}) or spec.get("jobTemplate", {}).get("spec", {})
            for c in pod.get("containers", []) + pod.get("initContainers", []):
                k8s_images.add(c["image"])
    for name in ("server", "dashboard", "agent"):
        assert services[name]["image"] in k8s_images, f"{name}: {services[name]['image']} not used in deploy/k8s"
