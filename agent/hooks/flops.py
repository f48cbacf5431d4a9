"""FLOPs of one training step, counted once by PyTorch's own counter, for the report's model FLOPs utilization (MFU).

`torch.utils.flop_counter.FlopCounterMode` (a dispatch mode: it sees every aten op and counts the matmuls,
convolutions and attention the way MFU papers do, forward and backward) is entered at the end of step 0 (warm-up
and model discovery) and left at the end of step 1, so exactly one whole step is counted: forward, backward and the
optimizer. It costs that one step some Python per op and nothing afterwards. Skipped when another trace (Kineto,
allocator history) covers step 1, and off with `FLEETPROF_HOOKS_FLOP_COUNT=false`. The count is this process's:
one rank's local batch, i.e. per GPU under data parallelism.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any

log = logging.getLogger(__name__)


class StepFlops:
    def __init__(self, torch: Any, *, enabled: bool = True):
        self._torch = torch
        self._mode: Any = None
        self.flops_per_step: int | None = None
        self.done = not enabled  # nothing left to do: counted, skipped, or off

    def tick(self, done: int, *, other_trace_active: bool, model: Any = None) -> None:
        """At a step boundary, `done` steps finished: start counting after step 0, read the count after step 1.
        A compiled model (torch.compile's OptimizedModule) is not counted: a dispatch mode around it would make
        dynamo recompile, twice, inside the user's step."""
        try:
            if self._mode is None:
                if done != 1 or other_trace_active or hasattr(model, "_orig_mod"):
                    self.done = True
                    return
                from torch.utils.flop_counter import FlopCounterMode  # lazy: only the hooks import torch

                self._mode = FlopCounterMode(display=False)
                self._mode.__enter__()
                return
            mode, self._mode = self._mode, None
            mode.__exit__(None, None, None)
            total = int(mode.get_total_flops())
            self.flops_per_step = total if total > 0 else None  # 0: nothing dispatched (CUDA graphs): unknown
            self.done = True
        except Exception as exc:  # never into the user's loop: the count is simply unknown
            log.info("fleetprof hooks: FLOP count unavailable: %s", exc)
            self.close()
            self.done = True

    def close(self) -> None:
        mode, self._mode = self._mode, None
        if mode is not None:
            with contextlib.suppress(Exception):  # leaving the mode after a failure: nothing more to do
                mode.__exit__(None, None, None)
