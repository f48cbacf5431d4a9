"""A job's measured run projected onto another GPU type (GET /api/v1/jobs/{job_id}/projection?gpu=TYPE).

Calibrated by what the fleet measured on both GPU types that the caller may see (a team token: its team's runs; a
scheduler or operator: every team's): runs of the job's fingerprint, else (telemetry basis only) other models'
pairs; the datasheet roofline otherwise (server/analysis/projection/calibrate.py)."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from sqlalchemy.orm import Session

from fleetprof.api_models import ProjectionOut
from server.analysis.base.gpu_catalog import find_model, load_catalog
from server.analysis.projection.calibrate import FleetPairs, fingerprint_calibration
from server.analysis.projection.inputs import NotEnoughData, measured_from_report
from server.analysis.projection.project import project
from server.auth.service import Principal
from server.config import ServerSettings
from server.errors import Conflict, InvalidInput
from server.jobs import report_store
from server.jobs.history import fingerprint_inputs, fingerprinted_inputs, reports_version
from server.lru import LruCache
from server.models import Job

# The newest runs read for a calibration (their stored `rightsizing_inputs` only): of the job's fingerprint, and
# of any model (other models' pairs).
CALIBRATION_RUNS = 500
FLEET_CALIBRATION_RUNS = 5000
# Grouped fleet runs per (database, analyzer version, oldest stored report, scope): (built at, newest stored report
# then, the groups).
FLEET_PAIRS: LruCache[tuple[Any, ...], tuple[float, Any, FleetPairs]] = LruCache(max_entries=64)
FLEET_PAIRS_REUSE_S = 30.0
FLEET_PAIRS_MAX_AGE_S = 600.0


def catalogue_names() -> list[str]:
    return [m.name for m in load_catalog()]


def _runs_scope(principal: Principal) -> tuple[bool, str | None]:
    """(whether `principal` may see any run, the one team it is limited to: None for every team)."""
    if principal.reads_all_jobs:
        return True, None
    return principal.team is not None, principal.team


def visible_fingerprint_runs(session: Session, job: Job, principal: Principal) -> list[Mapping[str, Any]]:
    """The stored `rightsizing_inputs` of the runs of `job`'s model that `principal` may see (a team token: its
    team's; a scheduler or operator: every team's), newest CALIBRATION_RUNS; [] without a fingerprint."""
    visible, team = _runs_scope(principal)
    if not job.fingerprint or not visible:
        return []
    return [inputs for _, inputs in fingerprint_inputs(session, job.fingerprint, team=team, limit=CALIBRATION_RUNS)]


def visible_fleet_pairs(session: Session, principal: Principal,
                        cache: LruCache[tuple[Any, ...], tuple[float, Any, FleetPairs]] = FLEET_PAIRS,
                        ) -> FleetPairs | None:
    """The fingerprinted runs `principal` may see (newest FLEET_CALIBRATION_RUNS), grouped for other models' pairs;
    None when it may see none. Kept per scope: rebuilt when a report was stored since (`reports_version`, one index
    probe) and the kept one is over FLEET_PAIRS_REUSE_S old, or when it is over FLEET_PAIRS_MAX_AGE_S old (a
    removed run leaves no other trace). A rebuild reads and groups up to 5000 runs (~50 ms): a busy fleet, storing
    reports every few seconds, pays it at most once per FLEET_PAIRS_REUSE_S per scope."""
    visible, team = _runs_scope(principal)
    if not visible:
        return None
    database, analyzer, oldest, newest = reports_version(session)
    key = (database, analyzer, oldest, team)  # a new oldest report: another set of runs, never reused
    now = time.monotonic()
    kept = cache.get(key)
    if kept is not None:
        built_at, version, pairs = kept
        age = now - built_at
        if age < FLEET_PAIRS_MAX_AGE_S and (version == newest or age < FLEET_PAIRS_REUSE_S):
            return pairs
    pairs = FleetPairs(fingerprinted_inputs(session, team=team, limit=FLEET_CALIBRATION_RUNS))
    cache.put(key, (now, newest, pairs))
    return pairs


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
    if calibration is None and run.shares.basis == "telemetry":
        # other models' pairs correct the telemetry roofline they were measured against; a trace's per-category
        # projection is the better one (bench/projection.py: 13.7 % against 21.5 %) and is kept as it is
        pairs = visible_fleet_pairs(session, principal)
        calibration = pairs.calibration(run.gpu, target) if pairs is not None else None
    answer = project(run, target, calibration=calibration)
    if (calibration is None or calibration.source != "fingerprint_runs") and target.name != run.gpu.name:
        hint = ("no run of this model visible on both types: one run of it on "
                f"{target.name} (any batch size) would calibrate this projection with its own measured ratio"
                if job.fingerprint else "the job has no fingerprint (run it with the hooks): runs of the same model "
                "on both types would calibrate this projection with a measured ratio")
        answer = answer.model_copy(update={"notes": [*answer.notes, hint]})
    return answer.model_copy(update={"job_id": job.job_id})
