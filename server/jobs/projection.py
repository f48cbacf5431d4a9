"""A job's measured run projected onto another GPU type (GET /api/v1/jobs/{job_id}/projection?gpu=TYPE)."""

from __future__ import annotations

from sqlalchemy.orm import Session

from fleetprof.api_models import ProjectionOut
from server.analysis.base.gpu_catalog import find_model, load_catalog
from server.analysis.projection.inputs import NotEnoughData, measured_from_report
from server.analysis.projection.project import project
from server.config import ServerSettings
from server.errors import Conflict, InvalidInput
from server.jobs import report_store
from server.models import Job


def catalogue_names() -> list[str]:
    return [m.name for m in load_catalog()]


def job_projection(session: Session, job: Job, settings: ServerSettings, *, gpu: str) -> ProjectionOut:
    """422: `gpu` is not in the catalogue; 409: the job lacks what a projection needs (the detail says what)."""
    target = find_model(gpu)
    if target is None:
        raise InvalidInput(f"unknown GPU type {gpu!r}; the catalogue has: {', '.join(catalogue_names())}")
    report = report_store.get_report(session, job, settings)
    try:
        run = measured_from_report(report, kineto_summaries=report_store.profile_kineto_summaries(session, job))
    except NotEnoughData as exc:
        raise Conflict(f"cannot project job {job.job_id!r}: {exc}") from exc
    return project(run, target).model_copy(update={"job_id": job.job_id})
