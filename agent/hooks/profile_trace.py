"""The opt-in profiler trace (`fleetprof run --profile STEPS`): torch.profiler over steps 1..K, uploaded as a Kineto
trace (gzip) to the job's traces, where the server analyzes it (time breakdown, kernels, the optimization plans).

Step 0 is warm-up and model discovery, so the trace starts at its end, as the allocator trace does. Each step
boundary inside the window calls `profile.step()`, which marks `ProfilerStep#N` (N = the hooks' step number) in the
trace: the analysis cuts steps at those. CPU activity always; CUDA activity when the run uses CUDA. Exporting the
trace happens on the training thread at the end of step K (once); gzip and upload happen on the sender thread.
"""

from __future__ import annotations

import gzip
import logging
import os
import tempfile
from typing import Any

from agent.hooks.sender import EventSender
from fleetprof.client import Client

log = logging.getLogger(__name__)


class ProfileTracer:
    def __init__(self, torch: Any, sender: EventSender, *, job_id: str, steps: int):
        self._torch = torch
        self._sender = sender
        self._job_id = job_id
        self.steps = max(0, steps)
        self._profile: Any = None

    @property
    def active(self) -> bool:
        return self._profile is not None

    def tick(self, steps_done: int, *, cuda: bool, rank: int) -> None:
        """At each boundary: start at the end of step 0, mark each step, stop and upload at the end of step K."""
        if not self.steps:
            return
        if steps_done == 1:
            activities = [self._torch.profiler.ProfilerActivity.CPU]
            if cuda:
                activities.append(self._torch.profiler.ProfilerActivity.CUDA)
            record = self._torch.profiler.ProfilerAction.RECORD
            # A schedule (always RECORD: we stop it ourselves) is what makes step() mark ProfilerStep#N; numbered
            # from 1 like the hooks' steps.
            self._profile = self._torch.profiler.profile(activities=activities, schedule=lambda _step: record)
            self._profile.step_num = 1
            self._profile.start()
        elif self._profile is not None:
            if steps_done == 1 + self.steps:
                self.stop(upload=True, rank=rank)  # closes ProfilerStep#K
            else:
                self._profile.step()

    def stop(self, *, upload: bool, rank: int) -> None:
        profile, self._profile = self._profile, None
        if profile is None:
            return
        profile.stop()
        if not upload:
            log.warning("fleetprof hooks: the job ended before %d profiled steps; no profiler trace uploaded",
                        self.steps)
            return
        fd, path = tempfile.mkstemp(prefix="fleetprof-profile-", suffix=".json")
        os.close(fd)
        try:
            profile.export_chrome_trace(path)
        except BaseException:
            os.unlink(path)
            raise
        job_id, first, last = self._job_id, 1, self.steps

        def upload_job(client: Client) -> None:
            try:
                with open(path, "rb") as f:
                    body = gzip.compress(f.read(), compresslevel=5)
            finally:
                os.unlink(path)
            client.upload_trace(job_id, body, filename=f"hooks-profile-steps-{first}-{last}.pt.trace.json", rank=rank)

        self._sender.submit(upload_job)
