"""The environment `fleetprof run` adds for a training child so that the PyTorch hooks switch on by themselves."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from agent.config import AgentSettings

log = logging.getLogger(__name__)

# Holds only `sitecustomize.py`: prepended to the child's PYTHONPATH, it runs at interpreter start-up,
# chains to any pre-existing sitecustomize and waits for the program to import torch.
SITE_DIR = Path(__file__).resolve().parent / "_site"

LEVELS = ("off", "default", "layers")


def install_level(settings: AgentSettings, *, can_send: bool) -> str | None:
    """The level a process's hooks (`fleetprof run`'s child, any framework) install at: None when they are off, or
    (logged) when they cannot send: no job id, or neither a server URL nor a transport (`can_send`). An unknown
    FLEETPROF_HOOKS_LEVEL reads as "default" (warned)."""
    level = settings.hooks_level
    if level == "off":
        return None
    if level not in LEVELS:
        log.warning("fleetprof hooks: unknown FLEETPROF_HOOKS_LEVEL=%r; using 'default'", level)
        level = "default"
    if not settings.job_id or not can_send:
        log.info("fleetprof hooks: no job id or server URL; hooks not installed")
        return None
    return level


def block_level(settings: AgentSettings) -> str | None:
    """The level of a `fleetprof.profile()` block's hooks (the block brings its own job id and transport): None
    when the hooks are off; an unknown level reads as "default"."""
    level = settings.hooks_level if settings.hooks_level in LEVELS else "default"
    return None if level == "off" else level


def layer_every(level: str, settings: AgentSettings) -> int:
    """Every how many steps the per-layer timing runs: each step at level "layers", else the setting's period."""
    return 1 if level == "layers" else settings.hooks_layer_every


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
