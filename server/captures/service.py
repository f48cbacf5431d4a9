"""Live captures of a running job (issue #19): requests, the hooks' state reports, and the link to the uploaded
trace. Services flush; the request (or the ingest transaction, for automatic captures) commits.

State machine: requested -> delivered -> capturing -> uploaded -> analyzed, and any state that is not final ->
failed. A state reported again is a no-op (every rank of a multi-rank capture reports it); anything else is a
Conflict. `uploaded` and `analyzed` are set by the trace upload, never by a report.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from fleetprof.api_models import Capture as CaptureRead
from fleetprof.api_models import CaptureCreate, CaptureStateUpdate, CaptureTrigger
from server.auth.service import Principal
from server.errors import Conflict, InvalidInput, NotFound
from server.models import FINAL_CAPTURE_STATES, TERMINAL_STATES, Capture, Job
from server.models.base import utcnow

# The reports the hooks may make, by the state the capture is in (failed: from any state that is not final).
_NEXT = {"requested": {"delivered"}, "delivered": {"capturing"}}


def requester(principal: Principal) -> str:
    return f"team:{principal.team}" if principal.scope == "team" else principal.scope


def to_read(capture: Capture, job: Job) -> CaptureRead:
    return CaptureRead(
        capture_id=capture.capture_id, job_id=job.job_id, kind=capture.kind,  # type: ignore[arg-type]
        steps=capture.steps, ranks=capture.ranks, state=capture.state,  # type: ignore[arg-type]
        reason=capture.reason, trigger=CaptureTrigger.model_validate(capture.trigger),
        requested_at=capture.requested_at, delivered_at=capture.delivered_at, capturing_at=capture.capturing_at,
        uploaded_at=capture.uploaded_at, analyzed_at=capture.analyzed_at, failed_at=capture.failed_at,
        trace_ids=list(capture.trace_ids or []), requested_by=capture.requested_by)


def request_capture(session: Session, *, job: Job, data: CaptureCreate, trigger: CaptureTrigger,
                    requested_by: str | None, now: datetime | None = None) -> Capture:
    """A new capture of `job` (running or pending; a job that ended: Conflict)."""
    if job.state in TERMINAL_STATES:
        raise Conflict(f"job {job.job_id!r} has ended ({job.state}): only a running job can be captured")
    capture = Capture(capture_id=uuid.uuid4().hex, job_pk=job.id, kind=data.kind, steps=data.steps,
                      ranks=list(dict.fromkeys(data.ranks)) if data.ranks is not None else None, state="requested",
                      trigger=trigger.model_dump(mode="json", exclude_none=True), trigger_kind=trigger.kind,
                      requested_by=requested_by, requested_at=now or utcnow(), trace_ids=[])
    session.add(capture)
    session.flush()
    return capture


def list_captures(session: Session, *, job: Job, state: str | None = None, rank: int | None = None) -> list[Capture]:
    """The job's captures, newest first. With `state=requested` and a `rank` (the hooks' poll): the captures still
    pending for that rank — requested ones it is named in, and ones another rank already took (delivered or
    capturing) that name this rank too and that it has not taken yet: every rank of a multi-rank capture sees it."""
    stmt = select(Capture).where(Capture.job_pk == job.id)
    if state is not None and not (state == "requested" and rank is not None):
        stmt = stmt.where(Capture.state == state)
    captures = list(session.scalars(stmt.order_by(Capture.requested_at.desc(), Capture.id.desc())))
    if state == "requested" and rank is not None:
        captures = [c for c in captures if _pending_for(c, rank)]
    return captures


def _pending_for(capture: Capture, rank: int) -> bool:
    if capture.ranks is not None and rank not in capture.ranks:
        return False
    if capture.state == "requested":
        return True
    return capture.state in ("delivered", "capturing") and rank not in (capture.delivered_ranks or [])


def get_capture(session: Session, *, job: Job, capture_id: str) -> Capture:
    """The capture `capture_id` of `job`; NotFound when it does not exist or is another job's."""
    capture = session.scalars(select(Capture).where(Capture.capture_id == capture_id,
                                                    Capture.job_pk == job.id)).first()
    if capture is None:
        raise NotFound(f"capture {capture_id!r} of job {job.job_id!r} not found")
    return capture


def report_state(session: Session, *, capture: Capture, update: CaptureStateUpdate) -> Capture:
    """Apply the hooks' report (delivered, capturing or failed)."""
    if update.state == "failed" and not (update.reason and update.reason.strip()):
        raise InvalidInput("`reason` is required when a capture failed")
    if update.state == "delivered" and update.rank is not None and update.rank not in (capture.delivered_ranks or []):
        capture.delivered_ranks = [*(capture.delivered_ranks or []), update.rank]  # a new list: the JSON column sees it
    if update.state == capture.state and update.state != "failed":
        session.flush()
        return capture  # another rank saying the same
    if update.state == "failed":
        if capture.state in FINAL_CAPTURE_STATES:
            raise Conflict(f"capture {capture.capture_id!r} is already {capture.state}")
        reason = update.reason or ""
        capture.reason = (f"rank {update.rank}: {reason}" if update.rank is not None else reason)[:2000]
        _enter(capture, "failed")
    elif update.state in _NEXT.get(capture.state, set()):
        _enter(capture, update.state)
    else:
        raise Conflict(f"capture {capture.capture_id!r} is {capture.state}: it cannot become {update.state}")
    session.flush()
    return capture


def _enter(capture: Capture, state: str, now: datetime | None = None) -> None:
    capture.state = state
    setattr(capture, f"{state}_at", now or utcnow())


def link_trace(session: Session, *, capture: Capture, trace_id: int) -> Capture:
    """The trace `trace_id` (stored and analyzed: the upload parses synchronously) carried `capture`: uploaded,
    then analyzed. A capture that already failed stays failed (its trace is still linked)."""
    if trace_id not in (capture.trace_ids or []):
        capture.trace_ids = [*(capture.trace_ids or []), trace_id]
    if capture.state not in FINAL_CAPTURE_STATES:
        now = utcnow()
        if capture.uploaded_at is None:
            _enter(capture, "uploaded", now)
        _enter(capture, "analyzed", now)
    session.flush()
    return capture


def fail_analysis(session: Session, *, capture: Capture, reason: str) -> None:
    """The capture's upload could not be analyzed: failed with the reason (unless it already ended)."""
    if capture.state in FINAL_CAPTURE_STATES:
        return
    now = utcnow()
    if capture.uploaded_at is None:
        capture.uploaded_at = now
    capture.reason = f"analysis failed: {reason}"[:2000]
    _enter(capture, "failed", now)
    session.flush()


def trigger_of(kind: str, summary: str, **evidence: Any) -> CaptureTrigger:
    return CaptureTrigger.model_validate({"kind": kind, "summary": summary, **evidence})
