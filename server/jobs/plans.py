"""A job's memory plans as a program applies them: the offset plan and the swap plan of the upload the report's
`optimization` section comes from, built at trace upload (`server.analysis.planning.optimization`)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from server.analysis.traces.sections import largest_plan
from server.errors import NotFound
from server.jobs.schemas import OffsetPlanOut, SwapPlanOut
from server.models import Job, Trace

NEEDS_TRACE = ("upload an allocation trace: a Kineto trace recorded with profile_memory=True (its [memory] events) "
               "or a memory snapshot with allocator history (`fleetprof import-trace JOB_ID FILE`)")


def _plan_entries(session: Session, job: Job) -> tuple[str, dict[str, Any]]:
    """(the upload's `kind:filename`, its stored plans); NotFound saying what to upload when there are none."""
    summaries = [t.summary | {"kind": t.kind, "filename": t.filename, "rank": t.rank}
                 for t in session.scalars(select(Trace).where(Trace.job_pk == job.id).order_by(Trace.id))]
    chosen = largest_plan(summaries)
    if chosen is None:
        raise NotFound(f"job {job.job_id!r} has no memory plan: {NEEDS_TRACE}")
    trace, _ = chosen
    plans = trace.get("plans")
    if not isinstance(plans, dict):
        raise NotFound(f"job {job.job_id!r}: the plan's upload {trace.get('filename')!r} was stored before plans "
                       f"were kept per allocation; upload it again to a new job, or {NEEDS_TRACE}")
    return f"{trace.get('kind')}:{trace.get('filename')}", plans


def _common(job: Job, source: str, plans: dict[str, Any]) -> dict[str, Any]:
    return {"job_id": job.job_id, "source": source, "trace_source": plans["source"], "device": plans["device"],
            "times_relative_to": plans["times_relative_to"]}


def offset_plan(session: Session, job: Job) -> OffsetPlanOut:
    source, plans = _plan_entries(session, job)
    part = plans["offsets"]
    return OffsetPlanOut(**_common(job, source, plans), **part, count=len(part["allocation"]))


def swap_plan(session: Session, job: Job) -> SwapPlanOut:
    source, plans = _plan_entries(session, job)
    part = plans["swap"]
    return SwapPlanOut(**_common(job, source, plans), **part, count=len(part["allocation"]))
