"""The repository stands alone: nothing tracked reads or links a folder beside it, and nothing tracked is built.

A clone placed in an empty directory must pass `make test` and serve `make run`; a reference to a sibling folder
(the data and specification the project started from lay in `../shared`) works on the machine that has it and
fails everywhere else, so it is caught here rather than by a newcomer.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]

# `../shared`, `"shared" / "data"`, `parent / "shared"`: each way this repository has spelled a sibling folder.
OUTSIDE = re.compile(r"""\.\./shared\b|["']shared["']\s*/\s*["']data|parent\s*/\s*["']shared\b|["']shared/data""")
# Build artefacts: wheels, sdists, bytecode, egg-info, virtual environments, benchmark output.
ARTEFACT = re.compile(r"""(\.whl|\.tar\.gz\.part|\.pyc|\.pyo)$|(^|/)(__pycache__|[^/]+\.egg-info|\.venv|bench/out)/""")


def _tracked() -> list[str]:
    try:
        out = subprocess.run(["git", "ls-files", "-z"], cwd=REPO_ROOT, capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError) as exc:  # an unpacked source archive: nothing to check
        pytest.skip(f"not a git checkout: {exc}")
    return [p for p in out.decode().split("\0") if p]


def test_no_tracked_file_refers_to_a_folder_beside_the_repository() -> None:
    this = Path(__file__).relative_to(REPO_ROOT).as_posix()
    found = []
    for rel in _tracked():
        path = REPO_ROOT / rel
        if rel == this or rel.startswith("tests/data/") or not path.is_file():
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:  # images, archives
            continue
        found += [f"{rel}:{n}: {line.strip()[:120]}" for n, line in enumerate(text.splitlines(), 1)
                  if OUTSIDE.search(line)]
    assert not found, "tracked files refer to a folder outside the repository:\n" + "\n".join(found)


def test_real_data_is_in_the_repository_with_its_sources() -> None:
    data = REPO_ROOT / "tests" / "data"
    sources = (data / "SOURCES.md").read_text()
    tops = sorted({p.relative_to(data).parts[0] for p in data.rglob("*") if p.is_file() and p.parent != data})
    assert tops, "tests/data holds no data"
    for top in tops:
        assert f"`{top}/" in sources, f"tests/data/{top} is not described in tests/data/SOURCES.md"
    # each source's licence beside its files: every data file has a LICENSE* in its folder or a parent below data/
    for path in data.rglob("*"):
        if not path.is_file() or path.parent == data or path.name.startswith(("LICENSE", "README")):
            continue
        parents = [p for p in path.parents if p != data and data in p.parents]
        assert any(next(p.glob("LICENSE*"), None) for p in parents), f"no licence beside {path.relative_to(data)}"


def test_nothing_tracked_is_a_build_artefact() -> None:
    artefacts = [rel for rel in _tracked() if ARTEFACT.search(rel)]
    assert not artefacts, f"build artefacts under version control: {artefacts}"
