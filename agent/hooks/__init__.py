"""Framework hooks that run inside the training process: PyTorch (`torch.py`), Keras on any backend (`keras.py`)
and JAX (`jax.py`).

Importing this package is cheap and imports no framework: each hooks module (which does) is loaded by the
`sitecustomize` in `_site/` only once the user's program has imported that framework itself.
"""

from __future__ import annotations

import sys

from agent.hooks.env import SITE_DIR, child_env

__all__ = ["SITE_DIR", "child_env", "fleetprof_step"]


def fleetprof_step(samples: int | None = None, wait: object = None, params: object = None) -> None:
    """Mark the end of a training step: for PyTorch loops without an optimizer, and JAX loops (`wait`: an output of
    the step to wait for, e.g. the loss; `params`: the parameter pytree, read once for the model's fingerprint; JAX
    only). A no-op when the hooks are off. Keras needs no marker."""
    mod = sys.modules.get("agent.hooks.torch")
    prof = mod.current() if mod is not None else None
    if prof is not None and prof.enabled:
        prof.step(samples)
        return
    jax_mod = sys.modules.get("agent.hooks.jax")
    jax_prof = jax_mod.current() if jax_mod is not None else None
    if jax_prof is not None:
        jax_prof.step(samples, wait, params=params)
