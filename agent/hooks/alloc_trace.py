"""The allocator trace (CUDA): recorded over K steps, uploaded as a `fleetprof.snapshot.v1` document. Used by
`fleetprof run --trace-allocator STEPS` (steps 1..K) and by live capture requests (agent.hooks.capture)."""

from __future__ import annotations

import gzip
import json
import logging

from agent.hooks.profile_trace import StepWindowTrace
from fleetprof.snapshot import snapshot_to_json

log = logging.getLogger(__name__)

MAX_ENTRIES = 200_000


class AllocTracer(StepWindowTrace):
    active = False  # recording the allocator's history

    def tick(self, steps_done: int, *, cuda: bool, rank: int) -> None:
        """At each boundary: start at the window's first boundary, stop and upload at its end."""
        if not self.steps:
            return
        if steps_done == self.first and not self.active:
            if not cuda:
                log.warning("fleetprof hooks: --trace-allocator is CUDA-only; this run is CPU-only, no allocator "
                            "trace (the run goes on)")
                return
            self._torch.cuda.memory._record_memory_history(max_entries=MAX_ENTRIES)
            self.active = True
        elif self.active and steps_done == self.first + self.steps:
            self.stop(upload=True, rank=rank)

    def stop(self, *, upload: bool, rank: int, quiet: bool = False) -> None:
        snapshot = self._torch.cuda.memory._snapshot() if upload else None
        self._torch.cuda.memory._record_memory_history(enabled=None)
        self.active = False
        if snapshot is None:
            return

        def make_body() -> bytes:
            # The "fleetprof.snapshot.v1" document, sent as `fleetprof import-trace` sends one (gzip).
            payload = snapshot_to_json(snapshot)
            return gzip.compress(json.dumps(payload, separators=(",", ":")).encode(), compresslevel=5)

        self._upload(make_body, rank=rank, name="alloc-trace", capture_name="alloc-", suffix=".json")
