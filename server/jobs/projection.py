"""A job's measured run projected onto another GPU type (GET /api/v1/jobs/{job_id}/projection?gpu=TYPE).

Calibrated by the runs of the job's fingerprint measured on both GPU types when the caller may see some (a team
token: its team's runs; a scheduler or operator: every team's); the datasheet roofline otherwise."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sqlalchemy.orm import Session

from fleetprof.api_models import ProjectionOut
from server.analysis.base.gpu_catalog import find_model, load_catalog
from server.analysis.projection.calibrate import fingerprint_calibration, fleet_pair_calibration
from server.analysis.projection.inputs import NotEnoughData, measured_from_report
from server.analysis.projection.project import project
from server.auth.service import Principal
from server.config import ServerSettings
from server.errors import Conflict, InvalidInput
from server.jobs import report_store
from server.jobs.history import fingerprint_inputs, fingerprinted_inputs
from server.models import Job

# The newest runs read for a calibration (their stored `rightsizing_inputs` only): of the job's fingerprint, and
# of any model (other models' pairs).
CALIBRATION_RUNS = 500
FLEET_CALIBRATION_RUNS = 5000


def catalogue_names() -> list[str]:
    return [m.name for m in load_catalog()]


def visible_fingerprint_runs(session: Session, job: Job, principal: Principal) -> list[Mapping[str, Any]]:
    """The stored `rightsizing_inputs` of the runs of `job`'s model that `principal` may see (a team token: its
    team's; a scheduler or operator: every team's), newest CALIBRATION_RUNS; [] without a fingerprint."""
    if not job.fingerprint or not (principal.reads_all_jobs or principal.team is not None):
        return []
    team = None if principal.reads_all_jobs else principal.team
    return [inputs for _, inputs in fingerprint_inputs(session, job.fingerprint, team=team, limit=CALIBRATION_RUNS)]


def visible_fleet_runs(session: Session, principal: Principal) -> list[tuple[str, Mapping[str, Any]]]:
    """(fingerprint, stored `rightsizing_inputs`) of the fingerprinted runs `principal` may see, newest
    FLEET_CALIBRATION_RUNS."""
    if not (principal.reads_all_jobs or principal.team is not None):
        return []
    team = None if principal.reads_all_jobs else principal.team
    return fingerprinted_inputs(session, team=team, limit=FLEET_CALIBRATION_RUNS)


def job_projection(session: Session, job: Job, settings: ServerSettings, *, gpu: str,
                   principal: Principal) -> ProjectionOut:
    """422: `gpu` is not in the catalogue; 409: the job lacks what a projection needs (the detail says what).
    `principal`: whose runs of the fingerprint may calibrate it."""
    target = find_model(gpu)
    if target is None:
        raise InvalidInput(f"unknown GPU type {gpu!r}; the catalogue has: {', '.join(catalogue_names())}")
    report = report_store.get_report(session, job, settings)
    try:
        run = measured_from_report(report, kineto_summaries=report_store.profile_kineto_summaries(session, job))
    except NotEnoughData as exc:
        raise Conflict(f"cannot project job {job.job_id!r}: {exc}") from exc
    runs = visible_fingerprint_runs(session, job, principal)
    calibration = (fingerprint_calibration(report.get("rightsizing_inputs") or {}, runs, source=run.gpu,
                                           target=target) if runs else None)
    if calibration is None:
        calibration = fleet_pair_calibration(visible_fleet_runs(session, principal), source=run.gpu, target=target)
    answer = project(run, target, calibration=calibration)
    if (calibration is None or calibration.source != "fingerprint_runs") and target.name != run.gpu.name:
        hint = ("no run of this model visible on both types: one run of it on "
                f"{target.name} (any batch size) would calibrate this projection with its own measured ratio"
                if job.fingerprint else "the job has no fingerprint (run it with the hooks): runs of the same model "
                "on both types would calibrate this projection with a measured ratio")
        answer = answer.model_copy(update={"notes": [*answer.notes, hint]})
    return answer.model_copy(update={"job_id": job.job_id})
