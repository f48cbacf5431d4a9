"""The opt-in allocator trace (CUDA): recorded over steps 1..K, uploaded as a `fleetprof.snapshot.v1` document."""

from __future__ import annotations

import gzip
import json
import logging
from typing import Any

from agent.hooks.sender import EventSender
from fleetprof.client import Client
from fleetprof.snapshot import snapshot_to_json

log = logging.getLogger(__name__)

MAX_ENTRIES = 200_000


class AllocTracer:
    def __init__(self, torch: Any, sender: EventSender, *, job_id: str, steps: int):
        self._torch = torch
        self._sender = sender
        self._job_id = job_id
        self.steps = max(0, steps)
        self.active = False

    def tick(self, steps_done: int, *, cuda: bool, rank: int) -> None:
        """At each boundary: start at the end of step 0, stop and upload at the end of step K."""
        if not self.steps:
            return
        if steps_done == 1:
            if not cuda:
                log.warning("fleetprof hooks: --trace-allocator is CUDA-only; this run is CPU-only, no allocator "
                            "trace (the run goes on)")
                return
            self._torch.cuda.memory._record_memory_history(max_entries=MAX_ENTRIES)
            self.active = True
        elif self.active and steps_done == 1 + self.steps:
            self.stop(upload=True, rank=rank)

    def stop(self, *, upload: bool, rank: int) -> None:
        snapshot = self._torch.cuda.memory._snapshot() if upload else None
        self._torch.cuda.memory._record_memory_history(enabled=None)
        self.active = False
        if snapshot is None:
            return
        job_id, first, last = self._job_id, 1, self.steps

        def upload_job(transport: Client) -> None:
            # The "fleetprof.snapshot.v1" document, sent as `fleetprof import-trace` sends one (gzip).
            payload = snapshot_to_json(snapshot)
            body = gzip.compress(json.dumps(payload, separators=(",", ":")).encode(), compresslevel=5)
            transport.upload_trace(job_id, body, filename=f"hooks-alloc-trace-steps-{first}-{last}.json", rank=rank)

        self._sender.submit(upload_job)
