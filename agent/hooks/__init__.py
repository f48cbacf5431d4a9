"""Framework hooks that run inside the training process (PyTorch today).

Importing this package is cheap and never imports torch: `agent.hooks.torch` (which does) is loaded by the
`sitecustomize` in `_site/` only once the user's program has imported torch itself.
"""

from __future__ import annotations

import sys

from agent.hooks.env import SITE_DIR, child_env

__all__ = ["SITE_DIR", "child_env", "fleetprof_step"]


def fleetprof_step(samples: int | None = None) -> None:
    """Mark the end of a training step, for loops without an optimizer. A no-op when the hooks are off."""
    mod = sys.modules.get("agent.hooks.torch")
    prof = mod.current() if mod is not None else None
    if prof is not None:
        prof.step(samples)
