"""deploy/docker/*.Dockerfile: what they COPY exists and is in the build context, the extras they install exist,
the default command is a real `fleetprof` command, and the slim image carries no torch."""

from __future__ import annotations

import fnmatch
import json
import re
import shlex
import tomllib
from pathlib import Path

import pytest

from tests.deploy.common import DEPLOY, REPO_ROOT, dockerfile_instructions, dockerfile_stages, parse_fleetprof

DOCKERFILES = sorted((DEPLOY / "docker").glob("*.Dockerfile"))
PYPROJECT = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())


def _dockerignore() -> list[str]:
    path = REPO_ROOT / ".dockerignore"
    if not path.exists():
        return []
    return [line.strip().rstrip("/") for line in path.read_text().splitlines()
            if line.strip() and not line.startswith("#")]


def _ignored(rel: str, patterns: list[str]) -> bool:
    """Whether .dockerignore drops `rel` (or a folder above it) from the build context."""
    prefixes = [str(Path(*Path(rel).parts[:i])) for i in range(1, len(Path(rel).parts) + 1)]
    return any(fnmatch.fnmatch(prefix, pattern) or fnmatch.fnmatch(prefix, pattern.removeprefix("**/"))
               for pattern in patterns if not pattern.startswith("!") for prefix in prefixes)


def _copy_sources(rest: str) -> list[str]:
    args = json.loads(rest) if rest.startswith("[") else shlex.split(rest)
    args = [a for a in args if not a.startswith("--")]
    return args[:-1]


def test_there_are_dockerfiles() -> None:
    names = {p.name for p in DOCKERFILES}
    assert {"server.Dockerfile", "agent.Dockerfile"} <= names


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_copy_sources_exist_in_the_build_context(dockerfile: Path) -> None:
    ignore = _dockerignore()
    for instr, rest in dockerfile_instructions(dockerfile):
        if instr not in ("COPY", "ADD") or "--from=" in rest:
            continue
        for src in _copy_sources(rest):
            assert (REPO_ROOT / src).exists(), f"{dockerfile.name}: COPY {src}: not in the repository"
            assert not _ignored(src, ignore), f"{dockerfile.name}: COPY {src} is excluded by .dockerignore"


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_installed_extras_exist(dockerfile: Path) -> None:
    extras = PYPROJECT["project"]["optional-dependencies"]
    text = dockerfile.read_text()
    named = set()
    for group in re.findall(r"\.\[([a-z0-9_,\s-]+)\]", text):
        named |= {e.strip() for e in group.split(",")}
    named |= set(re.findall(r"x\['([a-z0-9_-]+)'\]", text))
    assert named, f"{dockerfile.name} installs no extra"
    unknown = named - set(extras)
    assert not unknown, f"{dockerfile.name} installs extras that pyproject.toml does not define: {unknown}"


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_python_version_meets_requires_python(dockerfile: Path) -> None:
    required = PYPROJECT["project"]["requires-python"]
    minimum = tuple(int(x) for x in re.match(r">=\s*(\d+)\.(\d+)", required).groups())
    text = dockerfile.read_text()
    default = re.search(r"ARG PYTHON_VERSION=(\d+)\.(\d+)", text)
    for ref in re.findall(r"^FROM\s+python:(\S+)", text, re.MULTILINE):
        m = re.match(r"(\d+)\.(\d+)", ref) or default
        assert m, f"{dockerfile.name}: cannot tell the Python version of python:{ref}"
        assert tuple(int(x) for x in m.groups()) >= minimum, f"{dockerfile.name}: python:{ref} < {required}"


def test_server_image_targets_and_default_command() -> None:
    path = DEPLOY / "docker" / "server.Dockerfile"
    stages = dockerfile_stages(path)
    assert list(stages) == ["slim", "full"], "slim (no torch) first; full (default, last) adds the estimator"
    slim_text = " ".join(rest for _, rest in stages["slim"])
    assert "torch" not in slim_text.lower()
    extras = PYPROJECT["project"]["optional-dependencies"]
    assert not any(r.startswith("torch") for r in extras["server"] + extras["dashboard"]), \
        "the slim image installs server+dashboard: they must not pull torch"
    full_text = " ".join(rest for _, rest in stages["full"])
    assert "torch==2.13.0" in full_text and "/whl/cpu" in full_text, "the estimator gets the CPU build of torch"
    assert any(r.startswith("torch==2.13.0") for r in extras["estimate"])
    # migrations live beside the packages: the image must carry them for `fleetprof db upgrade`
    copied = {src for instr, rest in stages["slim"] if instr == "COPY" for src in _copy_sources(rest)}
    assert {"migrations", "server", "agent", "dashboard", "fleetprof", "pyproject.toml"} <= copied
    cmd = [rest for instr, rest in stages["slim"] if instr == "CMD"][-1]
    args = parse_fleetprof(json.loads(cmd))
    assert args.command == "server" and args.host == "0.0.0.0"
    user = [rest for instr, rest in stages["full"] if instr == "USER"][-1]
    assert user != "root" and user != "0", "the control-plane image runs unprivileged"
