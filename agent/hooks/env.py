"""The environment `fleetprof run` adds for a training child so that the PyTorch hooks switch on by themselves."""

from __future__ import annotations

import os
from pathlib import Path

# Holds only `sitecustomize.py`: prepended to the child's PYTHONPATH, it runs at interpreter start-up,
# chains to any pre-existing sitecustomize and waits for the program to import torch.
SITE_DIR = Path(__file__).resolve().parent / "_site"

LEVELS = ("off", "default", "layers")


def child_env(*, job_id: str, server_url: str | None, token: str | None, level: str = "default",
              pythonpath: str | None = None, alloc_trace_steps: int = 0, profile_steps: int = 0) -> dict[str, str]:
    """Variables to add to the child's environment (merge over the parent's: `{**os.environ, **child_env(...)}`).

    `pythonpath` is the PYTHONPATH the child would otherwise get; by default the parent's own, so that the
    user's PYTHONPATH survives the merge. With level "off" PYTHONPATH is left alone (no sitecustomize).
    """
    if level not in LEVELS:
        raise ValueError(f"hooks level {level!r} is not one of {LEVELS}")
    env = {"FLEETPROF_JOB_ID": job_id, "FLEETPROF_HOOKS_LEVEL": level}
    if alloc_trace_steps:
        env["FLEETPROF_HOOKS_ALLOC_TRACE_STEPS"] = str(alloc_trace_steps)
    if profile_steps:
        env["FLEETPROF_HOOKS_PROFILE_STEPS"] = str(profile_steps)
    if server_url:
        env["FLEETPROF_SERVER_URL"] = server_url
    if token:
        env["FLEETPROF_TOKEN"] = token
    if level != "off":
        # Not a setting: process plumbing, read only to be extended (the one PYTHONPATH the child gets).
        inherited = os.environ.get("PYTHONPATH", "") if pythonpath is None else pythonpath
        parts = [str(SITE_DIR)] + [p for p in inherited.split(os.pathsep) if p and p != str(SITE_DIR)]
        env["PYTHONPATH"] = os.pathsep.join(parts)
    return env
