"""Live capture requests (issue #19): a Kineto or allocator trace of the next K steps, asked for while the job runs.

The contract (shared with the server): the hooks poll `GET /api/v1/jobs/{job_id}/captures?state=requested&rank=R`
(R: this process's rank) with the job's own token every `FLEETPROF_HOOKS_CAPTURE_POLL_S` seconds (default 10, 0 =
off), on a daemon thread of their own that starts at the end of step 0 (so DataLoader workers and idle spawned
children never poll, and the rank is known by then). A request whose `ranks` include this process's rank (or is
null) is reported `delivered`, and handed to the training thread, which starts it at the next step boundary
(`capturing`) and stops it K boundaries later; the trace goes up through `POST
/api/v1/jobs/{job_id}/traces?capture_id=<id>` on the sender thread. One capture at a time: the poller takes no new
request while one is in hand, so several requests are served one after the other.

Nothing here may stall or crash the job: the training thread only reads one attribute per step outside capture
windows (`CaptureManager.busy`) and never does I/O; a failing poll is retried at the poll rate; a 401/404 answer
(token revoked, job unknown) stops polling for `REFUSED_PAUSE_S` and says why once in the log; a capture that cannot
be made or uploaded is reported `failed` with the reason.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from agent.hooks.alloc_trace import AllocTracer
from agent.hooks.profile_trace import ProfileTracer
from agent.hooks.sender import EventSender
from fleetprof.client import ApiError, Client
from fleetprof.jobid import job_path

log = logging.getLogger(__name__)

KINDS = ("kineto", "allocator")
REFUSED_PAUSE_S = 600.0  # a 401/404 poll answer pauses polling this long
NO_CUDA_REASON = "allocator captures need CUDA"


@dataclass(frozen=True)
class CaptureRequest:
    capture_id: str
    kind: str
    steps: int
    ranks: tuple[int, ...] | None

    @classmethod
    def parse(cls, raw: Any) -> CaptureRequest | None:
        """A `Capture` from the list answer, or None when it is not one the hooks can act on."""
        if not isinstance(raw, dict):
            return None
        cid, kind, steps, ranks = raw.get("capture_id"), raw.get("kind"), raw.get("steps"), raw.get("ranks")
        if not isinstance(cid, str) or not cid or kind not in KINDS or not isinstance(steps, int) or steps < 1:
            return None
        if ranks is not None:
            if not isinstance(ranks, list) or not all(isinstance(r, int) for r in ranks):
                return None
            ranks = tuple(ranks)
        return cls(cid, kind, steps, ranks)

    def wants(self, rank: int) -> bool:
        return self.ranks is None or rank in self.ranks


def post_state(client: Client, job_id: str, capture_id: str, state: str, *, rank: int,
               reason: str | None = None) -> None:
    body: dict[str, Any] = {"state": state, "rank": rank}
    if reason is not None:
        body["reason"] = reason[:1000]
    client.post_json(job_path(job_id, "captures", capture_id, "state"), body)


class CaptureManager:
    """Polls for capture requests (its own thread) and runs them at step boundaries (the training thread)."""

    def __init__(self, torch: Any, sender: EventSender, client: Client | None, *, job_id: str, poll_s: float,
                 rank: Callable[[], int], other_trace_active: Callable[[], bool] = lambda: False):
        self._torch = torch
        self._sender = sender
        self._client = client
        self._job_id = job_id
        self.poll_s = max(0.0, poll_s)
        self._rank = rank
        self._other_trace_active = other_trace_active
        # Handed from the poller to the training thread (one plain attribute: set by one, cleared by the other).
        self.pending: CaptureRequest | None = None
        self.busy = False  # a request pending or a capture running: the only attribute _boundary reads per step
        self._current: CaptureRequest | None = None
        self._tracer: ProfileTracer | AllocTracer | None = None
        self._seen: set[str] = set()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._warned: set[str] = set()
        self.polls = 0

    # ------------------------------------------------------------------ poller thread

    def start(self) -> None:
        """Start polling (once; a no-op when polling is off)."""
        if self.poll_s <= 0 or self._client is None or self._thread is not None:
            return
        self._thread = threading.Thread(target=self._run, name="fleetprof-captures", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def forget_thread(self) -> None:
        """After fork: the child has no poller thread and no capture of its own."""
        self._thread = None
        self._stop = threading.Event()
        self.pending = None
        self._current = None
        self._tracer = None
        self.busy = False

    def _warn_once(self, key: str, msg: str, *args: object) -> None:
        if key not in self._warned:
            self._warned.add(key)
            log.warning(msg, *args)

    def _run(self) -> None:
        wait = self.poll_s
        while not self._stop.wait(wait):
            wait = self.poll_s
            try:
                wait = self.poll_once()
            except Exception as exc:  # the thread must survive anything
                self._warn_once("poll-error", "fleetprof hooks: capture poll error: %r", exc)

    def poll_once(self) -> float:
        """One poll (when no capture is in hand); returns the seconds until the next one."""
        if self.busy or self._client is None:
            return self.poll_s
        self.polls += 1
        try:
            body = self._client.get_json(job_path(self._job_id, "captures"), state="requested", rank=self._rank())
        except ApiError as exc:
            if exc.status in (401, 404):
                self._warn_once(f"refused{exc.status}",
                                "fleetprof hooks: capture requests refused (%s); polling paused for %.0f s",
                                exc, REFUSED_PAUSE_S)
                return REFUSED_PAUSE_S
            self._warn_once("poll-retry", "fleetprof hooks: capture poll failed, retrying every %.1f s: %s",
                            self.poll_s, exc)
            return self.poll_s
        raw = body.get("captures") if isinstance(body, dict) else None
        if not isinstance(raw, list):
            self._warn_once("poll-shape", "fleetprof hooks: unexpected capture list answer: %.200r", body)
            return self.poll_s
        rank = self._rank()
        for item in reversed(raw):  # newest first on the wire: serve the oldest first
            req = CaptureRequest.parse(item)
            if req is None or req.capture_id in self._seen or not req.wants(rank):
                continue
            self._seen.add(req.capture_id)
            try:
                post_state(self._client, self._job_id, req.capture_id, "delivered", rank=rank)
            except ApiError as exc:
                if exc.retryable:  # still `requested` on the server: taken again at the next poll
                    self._seen.discard(req.capture_id)
                    self._warn_once("state-retry", "fleetprof hooks: capture state not reported, will retry: %s",
                                    exc)
                    return self.poll_s
                if exc.status != 409:  # 409: another rank reported it first; this rank still captures
                    log.warning("fleetprof hooks: capture %s dropped: %s", req.capture_id, exc)
                    continue
            self.pending = req
            self.busy = True
            return self.poll_s
        return self.poll_s

    # ------------------------------------------------------------------ training thread

    def tick(self, steps_done: int, *, cuda: bool, rank: int) -> None:
        """At each step boundary while `busy`: start a pending capture, or advance the running one."""
        tracer = self._tracer
        if tracer is not None:
            try:
                tracer.tick(steps_done, cuda=cuda, rank=rank)
            except Exception as exc:
                self._failed(f"capture error: {exc!r}", rank)
                self._stop_tracer()
                self._finished()  # free for the next request
                return
            if not tracer.active:
                self._finished()
            return
        req = self.pending
        if req is None or self._other_trace_active():
            return  # a --profile / --trace-allocator window is running: start after it
        self.pending = None
        self._current = req
        if req.kind == "allocator" and not cuda:
            self._failed(NO_CUDA_REASON, rank)
            self._finished()
            return
        cid = req.capture_id
        self._tracer = tracer = (
            ProfileTracer(self._torch, self._sender, job_id=self._job_id, steps=req.steps, first=steps_done,
                          capture_id=cid, on_upload_error=lambda e: self._upload_failed(cid, e, rank))
            if req.kind == "kineto" else
            AllocTracer(self._torch, self._sender, job_id=self._job_id, steps=req.steps, first=steps_done,
                        capture_id=cid, on_upload_error=lambda e: self._upload_failed(cid, e, rank)))
        self._sender.submit(lambda client: self._post(client, cid, "capturing", rank))  # before the upload
        try:
            tracer.tick(steps_done, cuda=cuda, rank=rank)
        except Exception as exc:
            self._failed(f"capture could not start: {exc!r}", rank)
            self._stop_tracer()
            self._finished()

    def close(self, rank: int) -> None:
        """The job ends: a capture under way is reported failed (no partial trace is uploaded)."""
        self.stop()
        if self._tracer is not None and self._tracer.active:
            self._stop_tracer()
            self._failed("the job ended before the capture's steps were done", rank)
        elif self.pending is not None:
            self._current = self.pending
            self._failed("the job ended before the capture started", rank)
        self.pending = None
        self._tracer = None
        self.busy = False

    def _stop_tracer(self) -> None:
        tracer, self._tracer = self._tracer, None
        if tracer is not None and tracer.active:
            try:
                tracer.stop(upload=False, rank=0, quiet=True)
            except Exception as exc:
                log.info("fleetprof hooks: stopping a capture: %r", exc)

    def _finished(self) -> None:
        self._tracer = None
        self._current = None
        self.busy = False

    def _failed(self, reason: str, rank: int) -> None:
        req = self._current
        if req is None:
            return
        log.warning("fleetprof hooks: capture %s failed: %s", req.capture_id, reason)
        cid = req.capture_id
        self._sender.submit(lambda client: self._post(client, cid, "failed", rank, reason))

    def _upload_failed(self, capture_id: str, exc: BaseException, rank: int) -> None:
        # On the sender thread, after the upload gave up.
        log.warning("fleetprof hooks: capture %s upload failed: %s", capture_id, exc)
        if self._client is not None:
            self._post(self._client, capture_id, "failed", rank, f"upload failed: {exc}")

    def _post(self, client: Client, capture_id: str, state: str, rank: int, reason: str | None = None) -> None:
        try:
            post_state(client, self._job_id, capture_id, state, rank=rank, reason=reason)
        except ApiError as exc:
            self._warn_once(f"state{exc.status}", "fleetprof hooks: capture %s state %r not reported: %s",
                            capture_id, state, exc)
