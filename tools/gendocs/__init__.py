"""Generated references under docs/: REST (OpenAPI), CLI (argparse), configuration (pydantic-settings).

    python -m tools.gendocs          # write them (`make docs`)
    python -m tools.gendocs --check  # exit 1 naming the stale files (what the test suite runs)
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from tools.gendocs import cli, config, rest

REPO_ROOT = Path(__file__).resolve().parents[2]
TARGETS: dict[str, Callable[[], str]] = {
    "docs/rest.md": rest.render,
    "docs/cli.md": cli.render,
    "docs/configuration.md": config.render,
}
COMMAND = "make docs"


def render_all() -> dict[str, str]:
    return {path: render() for path, render in TARGETS.items()}


def stale(root: Path = REPO_ROOT) -> list[str]:
    """Generated files whose content differs from what the code generates now (or that are missing)."""
    out = []
    for path, text in render_all().items():
        f = root / path
        if not f.is_file() or f.read_text() != text:
            out.append(path)
    return out
