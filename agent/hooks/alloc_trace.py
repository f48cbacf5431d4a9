"""The allocator trace (CUDA): recorded over K steps, uploaded as a `fleetprof.snapshot.v1` document. Used by
`fleetprof run --trace-allocator STEPS` (steps 1..K) and by live capture requests (agent.hooks.capture)."""

from __future__ import annotations

import gzip
import json
import logging
from collections.abc import Callable
from typing import Any

from agent.hooks.profile_trace import submit_upload
from agent.hooks.sender import EventSender
from fleetprof.snapshot import snapshot_to_json

log = logging.getLogger(__name__)

MAX_ENTRIES = 200_000


class AllocTracer:
    def __init__(self, torch: Any, sender: EventSender, *, job_id: str, steps: int, first: int = 1,
                 capture_id: str | None = None, on_upload_error: Callable[[BaseException], None] | None = None):
        self._torch = torch
        self._sender = sender
        self._job_id = job_id
        self.steps = max(0, steps)
        self.first = first  # the window starts at the end of step first-1 and covers steps first..first+steps-1
        self.capture_id = capture_id
        self._on_upload_error = on_upload_error
        self.active = False

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
        first, last = self.first, self.first + self.steps - 1
        name = f"hooks-alloc-trace-steps-{first}-{last}.json"
        if self.capture_id is not None:
            name = f"hooks-capture-{self.capture_id}-alloc-steps-{first}-{last}.json"

        def make_body() -> bytes:
            # The "fleetprof.snapshot.v1" document, sent as `fleetprof import-trace` sends one (gzip).
            payload = snapshot_to_json(snapshot)
            return gzip.compress(json.dumps(payload, separators=(",", ":")).encode(), compresslevel=5)

        submit_upload(self._sender, make_body, job_id=self._job_id, filename=name, rank=rank,
                      capture_id=self.capture_id, on_error=self._on_upload_error)
