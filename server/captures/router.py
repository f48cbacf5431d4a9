"""Live captures of a running job (issue #19): request one, list them (the hooks poll `?state=requested`), and the
hooks' state reports. Team tokens: their own jobs (another team's job answers 404, as other reads do); operators:
any job."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query

from fleetprof.api_models import Capture as CaptureRead
from fleetprof.api_models import CaptureCreate, CaptureList, CaptureState, CaptureStateUpdate
from server.captures import service as capture_service
from server.deps import CaptureAuth, SessionDep
from server.errors import problem_openapi_responses
from server.job_paths import JOB
from server.jobs import service as job_service

router = APIRouter(prefix="/api/v1/jobs", tags=["captures"])

CAPTURE_ID = "/{capture_id}"
_NOT_FOUND: dict[int | str, dict[str, Any]] = {
    404: {"description": "no such job (or capture), or not visible to this token"}}


@router.post(f"{JOB}/captures", response_model=CaptureRead, status_code=202,
             responses={**_NOT_FOUND, **problem_openapi_responses(409)},
             summary="Request a live capture (Kineto trace or allocator history) of K steps of a running job")
def request_capture(job_id: str, data: CaptureCreate, principal: CaptureAuth, session: SessionDep) -> CaptureRead:
    job = job_service.get_visible_job(session, job_id=job_id, principal=principal)
    trigger = capture_service.trigger_of("manual", f"requested by {capture_service.requester(principal)}")
    capture = capture_service.request_capture(session, job=job, data=data, trigger=trigger,
                                              requested_by=capture_service.requester(principal))
    return capture_service.to_read(capture, job)


@router.get(f"{JOB}/captures", response_model=CaptureList, responses=_NOT_FOUND,
            summary="A job's captures, newest first (the hooks poll `?state=requested`)")
def list_captures(job_id: str, principal: CaptureAuth, session: SessionDep,
                  state: Annotated[CaptureState | None, Query(description="only captures in this state")] = None,
                  rank: Annotated[int | None, Query(ge=0, description=(
                      "with state=requested: the captures still pending for this rank (the hooks' poll), also "
                      "those another rank of a multi-rank capture already took"))] = None,
                  ) -> CaptureList:
    job = job_service.get_visible_job(session, job_id=job_id, principal=principal)
    return CaptureList(captures=[capture_service.to_read(c, job)
                                 for c in capture_service.list_captures(session, job=job, state=state, rank=rank)])


@router.post(f"{JOB}/captures{CAPTURE_ID}/state", response_model=CaptureRead,
             responses={**_NOT_FOUND, **problem_openapi_responses(409)},
             summary="The hooks' report of a capture's progress: delivered, capturing or failed (with a reason)")
def report_state(job_id: str, capture_id: str, update: CaptureStateUpdate, principal: CaptureAuth,
                 session: SessionDep) -> CaptureRead:
    job = job_service.get_visible_job(session, job_id=job_id, principal=principal)
    capture = capture_service.get_capture(session, job=job, capture_id=capture_id)
    return capture_service.to_read(capture_service.report_state(session, capture=capture, update=update), job)
