"""The profiler trace: torch.profiler over K steps, uploaded as a Kineto trace (gzip) to the job's traces, where the
server analyzes it (time breakdown, kernels, the optimization plans). Used by `fleetprof run --profile STEPS`
(steps 1..K) and by live capture requests (agent.hooks.capture: K steps from the boundary the request is taken at).

Step 0 is warm-up and model discovery, so a `--profile` trace starts at its end, as the allocator trace does. Each
step boundary inside the window calls `profile.step()`, which marks `ProfilerStep#N` (N = the hooks' step number) in
the trace: the analysis cuts steps at those. CPU activity always; CUDA activity when the run uses CUDA. Exporting the
trace happens on the training thread at the end of the window's last step (once); gzip and upload happen on the
sender thread.
"""

from __future__ import annotations

import gzip
import logging
import os
import tempfile
from collections.abc import Callable
from typing import Any

from agent.hooks.sender import EventSender
from fleetprof.client import ApiError, Client
from fleetprof.jobid import job_path

log = logging.getLogger(__name__)

UPLOAD_GIVE_UP_S = 60.0  # a capture's upload is retried (network, 5xx) this long, then reported failed


def upload(client: Client, job_id: str, gzipped: bytes, *, filename: str, rank: int, capture_id: str | None) -> None:
    """POST the trace to the job's traces; with `capture_id` (a live capture) retried a while and linked to it."""
    if capture_id is None:
        client.upload_trace(job_id, gzipped, filename=filename, rank=rank)
        return
    client.request_retrying("POST", job_path(job_id, "traces"), give_up_after_s=UPLOAD_GIVE_UP_S,
                            raw_body=gzipped, content_type="application/gzip", compress=False,
                            params={"filename": filename, "rank": rank, "capture_id": capture_id})


def submit_upload(sender: EventSender, make_body: Callable[[], bytes], *, job_id: str, filename: str, rank: int,
                  capture_id: str | None, on_error: Callable[[BaseException], None] | None) -> None:
    """Build (gzip) and upload on the sender thread; an error goes to `on_error` (else the sender logs it)."""

    def upload_job(client: Client) -> None:
        try:
            body = make_body()
            upload(client, job_id, body, filename=filename, rank=rank, capture_id=capture_id)
        except (ApiError, OSError, ValueError) as exc:
            if on_error is None:
                raise
            on_error(exc)

    sender.submit(upload_job)


class StepWindowTrace:
    """A trace of `steps` steps, from the end of step first-1 to the end of step first+steps-1, uploaded to the job
    when the window closes; with a `capture_id`, as that live capture's trace. The Kineto and the allocator
    tracers share this; each records its own way."""

    def __init__(self, torch: Any, sender: EventSender, *, job_id: str, steps: int, first: int = 1,
                 capture_id: str | None = None, on_upload_error: Callable[[BaseException], None] | None = None):
        self._torch = torch
        self._sender = sender
        self._job_id = job_id
        self.steps = max(0, steps)
        self.first = first
        self.capture_id = capture_id
        self._on_upload_error = on_upload_error

    def _upload(self, make_body: Callable[[], bytes], *, rank: int, name: str, capture_name: str,
                suffix: str) -> None:
        """Upload the body as `hooks-<name>-steps-A-B<suffix>` (or `hooks-capture-<id>-<capture_name>steps-...`)."""
        steps = f"steps-{self.first}-{self.first + self.steps - 1}{suffix}"
        filename = (f"hooks-{name}-{steps}" if self.capture_id is None
                    else f"hooks-capture-{self.capture_id}-{capture_name}{steps}")
        submit_upload(self._sender, make_body, job_id=self._job_id, filename=filename, rank=rank,
                      capture_id=self.capture_id, on_error=self._on_upload_error)


class ProfileTracer(StepWindowTrace):
    _profile: Any = None  # the running torch.profiler.profile

    @property
    def active(self) -> bool:
        return self._profile is not None

    def tick(self, steps_done: int, *, cuda: bool, rank: int) -> None:
        """At each boundary: start at the window's first boundary, mark each step, stop and upload at its end."""
        if not self.steps:
            return
        if steps_done == self.first and self._profile is None:
            activities = [self._torch.profiler.ProfilerActivity.CPU]
            if cuda:
                activities.append(self._torch.profiler.ProfilerActivity.CUDA)
            record = self._torch.profiler.ProfilerAction.RECORD
            # A schedule (always RECORD: we stop it ourselves) is what makes step() mark ProfilerStep#N; numbered
            # like the hooks' steps.
            profile = self._torch.profiler.profile(activities=activities, schedule=lambda _step: record)
            profile.step_num = self.first
            profile.start()
            self._profile = profile
        elif self._profile is not None:
            if steps_done == self.first + self.steps:
                self.stop(upload=True, rank=rank)  # closes the window's last ProfilerStep#
            else:
                self._profile.step()

    def stop(self, *, upload: bool, rank: int, quiet: bool = False) -> None:
        profile, self._profile = self._profile, None
        if profile is None:
            return
        profile.stop()
        if not upload:
            if not quiet:
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

        def make_body() -> bytes:
            try:
                with open(path, "rb") as f:
                    return gzip.compress(f.read(), compresslevel=5)
            finally:
                os.unlink(path)

        self._upload(make_body, rank=rank, name="profile", capture_name="", suffix=".pt.trace.json")
