"""Jobs: register/update, list, get, compare, report, timeseries, steps, right-sizing."""

from __future__ import annotations

import time
from concurrent.futures import Future
from datetime import UTC, datetime
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query, Response
from fastapi.responses import HTMLResponse, JSONResponse
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from fleetprof.api_models import CharacterizationOut, CompareOut, JobList, JobRead, ProjectionOut
from fleetprof.fingerprint import FINGERPRINT_PATTERN
from fleetprof.jobid import job_path, report_filename
from fleetprof.protocol import SAMPLE_FIELD_NAMES
from fleetprof.report import JobReport
from fleetprof.units import unit_symbol
from server.analysis.compare import compare_runs
from server.analysis.configurations import characterize_configurations
from server.analysis.fleet.rightsizing import rightsize
from server.auth.service import Principal
from server.config import ServerSettings
from server.db import read_in_parallel
from server.deps import DispatcherDep, EpochQuery, JobReaderAuth, PrincipalDep, SessionDep, SettingsDep
from server.errors import Forbidden, InvalidInput, NotFound
from server.job_paths import JOB
from server.jobs import loader, plans, plot_series, report_store
from server.jobs import service as job_service
from server.jobs.history import rightsizing_history
from server.jobs.html_report import render_report_html
from server.jobs.plot_series import downsampled_steps, step_memory_source, wall_histogram
from server.jobs.projection import job_projection, visible_fingerprint_runs, visible_fleet_pairs
from server.jobs.schemas import (
    JobAck,
    JobCreate,
    JobState,
    OffsetPlanOut,
    RightsizingOut,
    SeriesOut,
    StepsOut,
    SwapPlanOut,
    TimeseriesBatchOut,
    TimeseriesOut,
)
from server.models import Gpu, Job, JobStep
from server.models.base import from_epoch, to_epoch
from server.responses import json_response

router = APIRouter(prefix="/api/v1/jobs", tags=["jobs"])

JOB_NOT_FOUND: dict[int | str, dict[str, Any]] = {404: {"description": "no such job, or not visible to this token"}}
TIMESERIES_METRICS = SAMPLE_FIELD_NAMES
COMPARE_MIN, COMPARE_MAX = 2, 20


def _job_link(path: str, method: str = "get") -> dict[str, Any]:
    """An OpenAPI link from a registration's answer to an operation on that job (clients and the stateful fuzzer
    follow them: register -> upload -> read)."""
    pointer = path.replace("~", "~0").replace("/", "~1").replace("{", "%7B").replace("}", "%7D")
    return {"operationRef": f"#/paths/{pointer}/{method}", "parameters": {"job_id": "$response.body#/job_id"}}


JOB_LINKS = {name: _job_link(f"/api/v1/jobs/{{job_id}}{suffix}", method) for name, suffix, method in (
    ("GetJob", "", "get"), ("GetReport", "/report", "get"), ("GetTimeseries", "/timeseries", "get"),
    ("GetTimeseriesBatch", "/timeseries/batch", "get"), ("GetSteps", "/steps", "get"),
    ("GetRightsizing", "/rightsizing", "get"), ("UploadTrace", "/traces", "post"))}


@router.post("", response_model=JobRead | JobAck,
             responses={200: {"links": JOB_LINKS}, 401: {}, 403: {}, 404: {}, 422: {}},
             summary="Register a job, or update a registered one (agent tokens get an acknowledgement only)")
def register_job(data: JobCreate, principal: PrincipalDep, session: SessionDep,
                 dispatcher: DispatcherDep) -> JobRead | JobAck:
    if principal.scope not in ("team", "agent", "operator"):
        raise Forbidden(f"a {principal.scope} token cannot register jobs")
    job, became_terminal = job_service.upsert_job(session, data, principal=principal)
    uuids = job_service.gpu_uuids_of(session, [job.id])[job.id]
    read = job_service.to_read(job, uuids)
    if became_terminal:
        session.commit()  # the task must see the committed end
        dispatcher.characterize(job.id)
    if principal.scope == "agent":
        return JobAck(job_id=read.job_id, state=read.state, node=read.node, gpu_uuids=read.gpu_uuids)
    return read


@router.get("", response_model=JobList, summary="List jobs visible to this token")
def list_jobs(principal: JobReaderAuth, session: SessionDep, team: str | None = None,
              state: JobState | None = None, since: EpochQuery = None, until: EpochQuery = None,
              q: str | None = Query(None, max_length=200, description="search job_id or name"),
              fingerprint: str | None = Query(None, pattern=FINGERPRINT_PATTERN,
                                              description="runs of the same model: the report's "
                                                          "fingerprint.fingerprint (20 hex characters)"),
              limit: int = Query(50, ge=1, le=1000), offset: int = Query(0, ge=0)) -> JobList:
    jobs, total = job_service.list_jobs(session, principal=principal, team=team, state=state,
                                        since=from_epoch(since), until=from_epoch(until), q=q, limit=limit,
                                        offset=offset, fingerprint=fingerprint)
    uuids = job_service.gpu_uuids_of(session, [j.id for j in jobs])
    now = time.time()
    return JobList(items=[job_service.to_read(j, uuids[j.id], now=now) for j in jobs], total=total, limit=limit,
                   offset=offset)


def parse_compare_ids(ids: str) -> list[str]:
    """`a,b,c` -> ["a", "b", "c"]: 2 to 20 distinct, non-empty ids (InvalidInput says what is wrong)."""
    parts = [p.strip() for p in ids.split(",")]
    if any(not p for p in parts):
        raise InvalidInput("ids: an empty job id (write ids=a,b,c)")
    if not COMPARE_MIN <= len(parts) <= COMPARE_MAX:
        raise InvalidInput(f"ids: compare {COMPARE_MIN} to {COMPARE_MAX} jobs, not {len(parts)}")
    dupes = sorted({p for p in parts if parts.count(p) > 1})
    if dupes:
        raise InvalidInput(f"ids: {', '.join(repr(d) for d in dupes)} named more than once")
    return parts


# Declared before JOB: that route would otherwise take "compare" for a job id.
@router.get("/compare", response_model=CompareOut, responses={**JOB_NOT_FOUND, 422: {}},
            summary="Compare runs (GPU types, counts, frameworks, batch sizes) against the first id's run")
def compare_jobs(principal: JobReaderAuth, session: SessionDep, settings: SettingsDep,
                 ids: str = Query(..., max_length=20 * 201,
                                  description="2 to 20 comma-separated job ids; the first is the baseline"),
                 ) -> CompareOut:
    jobs = job_service.get_visible_jobs(session, job_ids=parse_compare_ids(ids), principal=principal)
    runs = [({"job_id": j.job_id, "name": j.name, "team": j.team, "framework": j.framework,
              "batch_size": j.batch_size, "state": j.state, "applied": (j.extra or {}).get("applied")},
             report_store.get_report(session, j, settings))
            for j in jobs]
    return compare_runs(runs)


CHARACTERIZATION_MAX = 100


# Declared before JOB, like /compare.
@router.get("/characterization", response_model=CharacterizationOut, responses={**JOB_NOT_FOUND, 422: {}},
            summary="One model across configurations (GPU type and count, batch size, precision, framework): "
                    "the runs of a fingerprint, or chosen job ids, with findings")
def characterize_fingerprint(principal: JobReaderAuth, session: SessionDep, settings: SettingsDep,
                             fingerprint: str | None = Query(None, pattern=FINGERPRINT_PATTERN,
                                                             description="the runs of this fingerprint visible to "
                                                                         "the token, newest first"),
                             ids: str | None = Query(None, max_length=20 * 201,
                                                     description="or 2 to 20 comma-separated job ids"),
                             limit: int = Query(50, ge=1, le=CHARACTERIZATION_MAX,
                                                description="at most this many runs (newest first)"),
                             ) -> CharacterizationOut:
    if (fingerprint is None) == (ids is None):
        raise InvalidInput("give exactly one of fingerprint= or ids=")
    if ids is not None:
        jobs = job_service.get_visible_jobs(session, job_ids=parse_compare_ids(ids), principal=principal)
        total = len(jobs)
    else:
        jobs, total = job_service.list_jobs(session, principal=principal, team=None, state=None, since=None,
                                            until=None, q=None, limit=limit, offset=0, fingerprint=fingerprint)
    runs = [({"job_id": j.job_id, "name": j.name, "framework": j.framework, "batch_size": j.batch_size,
              "state": j.state, "metadata": j.extra or {}}, report_store.get_report(session, j, settings))
            for j in jobs]
    return characterize_configurations(runs, fingerprint=fingerprint, runs_total=total)


@router.get(JOB, response_model=JobRead, responses=JOB_NOT_FOUND, summary="A job's metadata and state")
def get_job(job_id: str, principal: JobReaderAuth, session: SessionDep) -> JobRead:
    job = job_service.get_visible_job(session, job_id=job_id, principal=principal)
    return job_service.to_read(job, job_service.gpu_uuids_of(session, [job.id])[job.id])


# The stored document is sent as it is (it was validated as a JobReport when computed): the model documents it.
@router.get(f"{JOB}/report", response_model=JobReport,
            responses={**JOB_NOT_FOUND, 200: {"content": {"text/html": {"schema": {"type": "string"}}}}},
            summary="The job's characterization (JSON, or ?format=html for a standalone page)")
def get_report(job_id: str, principal: JobReaderAuth, session: SessionDep, settings: SettingsDep,
               format: Literal["json", "html"] = "json", refresh: bool = False,
               download: bool = Query(False, description="as an attachment: fleetprof-<job id>.json / .html")) -> Any:
    job = job_service.get_visible_job(session, job_id=job_id, principal=principal)
    report = report_store.get_report(session, job, settings, refresh=refresh)
    headers = ({"Content-Disposition": f'attachment; filename="{report_filename(job.job_id, format)}"'}
               if download else None)
    if format == "html":
        series = _series(session, job, dict.fromkeys(("memory_used_bytes", "power_w", "gpu_util_pct"), 600),
                         None, None)
        return HTMLResponse(render_report_html(report, series), headers=headers)
    return JSONResponse(report, headers=headers)


POINTS_DOC = ("at most this many points per GPU: each time bucket's minimum at its first sample and maximum at its "
              "last (buckets are whole runs of a fixed grid of 4,096 per range, so 70-100 % of the budget); a GPU "
              "with no more samples than that gets its samples")


def _series(session: Session, job: Any, points: dict[str, int], since: float | None,
            until: float | None) -> dict[str, list[SeriesOut]]:
    """Per metric (-> its points budget), the job's per-GPU series; each GPU's samples are read once for all."""
    out: dict[str, list[SeriesOut]] = {m: [] for m in points}
    now_dt = datetime.now(UTC)
    # A finished job's whole-range view comes from its stored plot views, exactly as the samples would give it.
    stored = report_store.final_plot_views(session, job) if since is None and until is None else None
    reads: list[tuple[Gpu, dict[str, plot_series.Series] | Future[dict[str, plot_series.Series]] | None]] = []
    for gpu, start, end in loader.job_gpu_windows(session, job, now=now_dt):
        if since is not None:
            start = max(start, from_epoch(since))
        if until is not None:
            end = min(end, from_epoch(until))
        stored_series = stored.series(gpu, start, end, points) if stored is not None else None
        if stored_series is None and end >= start:
            # The GPUs' scans overlap on connections of their own (8 GPUs x 24 h at 1 Hz: ~1.7 s one after another).
            reads.append((gpu, read_in_parallel(session, plot_series.downsampled_series, gpu, start, end, points)))
        else:
            reads.append((gpu, stored_series))
    for gpu, read in reads:
        series = ({m: ([], [], 0) for m in points} if read is None
                  else read if isinstance(read, dict) else read.result())
        for metric, (ts, vals, raw) in series.items():
            out[metric].append(SeriesOut(gpu_uuid=gpu.uuid, gpu_index=gpu.index,
                                         memory_total_bytes=gpu.memory_total_bytes, ts=ts, values=list(vals),
                                         raw_points=raw,
                                         min=min(vals) if vals else None, max=max(vals) if vals else None))
    return out


@router.get(f"{JOB}/timeseries", response_model=TimeseriesOut, responses=JOB_NOT_FOUND,
            summary="A downsampled per-GPU series for plots (min/max preserved)")
def get_timeseries(job_id: str, principal: JobReaderAuth, session: SessionDep,
                   metric: Annotated[str, Query(description=f"one of {', '.join(TIMESERIES_METRICS)}")],
                   points: int = Query(1000, ge=10, le=20_000, description=POINTS_DOC), since: EpochQuery = None,
                   until: EpochQuery = None) -> TimeseriesOut:
    if metric not in TIMESERIES_METRICS:
        raise InvalidInput(f"unknown metric {metric!r}; one of {', '.join(TIMESERIES_METRICS)}")
    job = job_service.get_visible_job(session, job_id=job_id, principal=principal)
    series = _series(session, job, {metric: points}, since, until)[metric]
    return TimeseriesOut(job_id=job.job_id, metric=metric, unit=unit_symbol(metric), source="nvml", points=points,
                         series=series)


@router.get(f"{JOB}/timeseries/batch", response_model=TimeseriesBatchOut, responses=JOB_NOT_FOUND,
            summary="Several downsampled per-GPU series at once: each GPU's samples are read once for all")
def get_timeseries_batch(job_id: str, principal: JobReaderAuth, session: SessionDep,
                         metric: Annotated[list[str], Query(description="repeated: metric=power_w&metric=...")],
                         points: Annotated[list[int],
                                           Query(description="one budget for all, or one per metric: "
                                                             + POINTS_DOC)] = [1000],  # noqa: B006 - FastAPI deep-copies defaults
                         since: EpochQuery = None, until: EpochQuery = None) -> TimeseriesBatchOut:
    unknown = [m for m in metric if m not in TIMESERIES_METRICS]
    if unknown or not metric or len(set(metric)) != len(metric) or len(metric) > 8:
        raise InvalidInput(f"metric: up to 8 distinct of {', '.join(TIMESERIES_METRICS)}")
    if len(points) not in (1, len(metric)) or not all(10 <= p <= 20_000 for p in points):
        raise InvalidInput("points: one value, or one per metric, each 10 to 20000")
    budgets = dict(zip(metric, points * len(metric) if len(points) == 1 else points, strict=True))
    job = job_service.get_visible_job(session, job_id=job_id, principal=principal)
    series = _series(session, job, budgets, since, until)
    return TimeseriesBatchOut(job_id=job.job_id, metrics={
        m: TimeseriesOut(job_id=job.job_id, metric=m, unit=unit_symbol(m), source="nvml", points=budgets[m],
                         series=series[m]) for m in metric})


@router.get(f"{JOB}/steps", response_model=StepsOut,
            summary="Per-step wall time and allocator peaks from the framework hooks",
            responses=JOB_NOT_FOUND)
def job_steps(job_id: str, principal: JobReaderAuth, session: SessionDep, since: EpochQuery = None,
              until: EpochQuery = None, limit: int = Query(20_000, ge=1, le=200_000),
              points: int | None = Query(None, ge=10, le=20_000, description=(
                  "downsample to about this many rows per rank (each time bucket's minima at its first step, "
                  "maxima at its last) and add a step-time histogram of every step in the range"))) -> Response:
    job = job_service.get_visible_job(session, job_id=job_id, principal=principal)
    where = [JobStep.job_pk == job.id]
    if since is not None:
        where.append(JobStep.ts >= from_epoch(since))
    if until is not None:
        where.append(JobStep.ts <= from_epoch(until))
    source = "framework hooks (per-step wall time; torch.cuda max_memory_allocated/reserved per step)"
    if points is not None and since is None and until is None:
        # A finished job's whole-range view comes from its stored plot views, as the steps would give it.
        stored = report_store.final_plot_views(session, job)
        if stored is not None and (down := stored.downsampled_steps(points)) is not None:
            return json_response({"job_id": job.job_id, "memory_source": stored.memory_source, "source": source,
                          "wall_s_histogram": stored.histogram, **down["rows"], "raw_count": down["raw_count"],
                          "downsampled": True})
    meta = {"job_id": job.job_id, "memory_source": step_memory_source(session, where), "source": source}
    if points is not None:
        # The histogram (one row per step) is read on a connection of its own while this one buckets the rows.
        histogram = read_in_parallel(session, wall_histogram, where)
        first, last = session.execute(select(func.min(JobStep.ts), func.max(JobStep.ts)).where(*where)).one()
        down = downsampled_steps(session, where, first, last, points) if first is not None else \
            {"rows": {}, "raw_count": 0, "max_per_rank": 0}
        meta["wall_s_histogram"] = histogram.result()
        if down["max_per_rank"] > points:
            return json_response({**meta, **down["rows"], "raw_count": down["raw_count"], "downsampled": True})
        limit = max(down["raw_count"], 1)
    # The most recent `limit` steps, returned in time order.
    steps = list(session.scalars(select(JobStep).where(*where).order_by(JobStep.ts.desc()).limit(limit)))[::-1]
    out = {
        **meta, "count": len(steps),
        "rank": [s.rank for s in steps], "step": [s.step for s in steps], "ts": [to_epoch(s.ts) for s in steps],
        "wall_s": [s.wall_s for s in steps], "allocated_peak_bytes": [s.allocated_peak_bytes for s in steps],
        "reserved_peak_bytes": [s.reserved_peak_bytes for s in steps],
    }
    if points is not None:
        out.update(raw_count=len(steps), downsampled=False)
    return json_response(out)


@router.get(f"{JOB}/rightsizing", response_model=RightsizingOut, responses=JOB_NOT_FOUND,
            summary="Right-sizing: GPU type and count, batch size, power cap, with reasons and evidence")
def get_rightsizing(job_id: str, principal: JobReaderAuth, session: SessionDep, settings: SettingsDep,
                    history: int = Query(50, ge=1, le=500, description="past runs of the same job name to use"),
                    ) -> dict[str, Any]:
    job = job_service.get_visible_job(session, job_id=job_id, principal=principal)
    return _rightsizing(session, job, settings, history, principal)


@router.get(f"{JOB}/projection", response_model=ProjectionOut,
            responses={**JOB_NOT_FOUND,
                       409: {"description": "the job lacks what a projection needs (its GPU type, a step time)"},
                       422: {"description": "the GPU type is not in the catalogue (the detail lists its names)"}},
            summary="The job's step time, power, energy per step and memory projected onto another GPU type")
def get_projection(job_id: str, principal: JobReaderAuth, session: SessionDep, settings: SettingsDep,
                   gpu: str = Query(..., min_length=1, max_length=100,
                                    description="target GPU type: a catalogue name or an NVML device name")
                   ) -> ProjectionOut:
    job = job_service.get_visible_job(session, job_id=job_id, principal=principal)
    return job_projection(session, job, settings, gpu=gpu, principal=principal)


PLAN_NOT_FOUND: dict[int | str, dict[str, Any]] = {
    404: {"description": "no such job, or not visible to this token, or no allocation trace uploaded to it (the "
                         "detail says which upload gives a plan)"}}


@router.get(f"{JOB}/plans/offsets", response_model=OffsetPlanOut, responses=PLAN_NOT_FOUND,
            summary="The offset plan: every traced allocation's offset in one arena (from an allocation trace)")
def get_offset_plan(job_id: str, principal: JobReaderAuth, session: SessionDep) -> OffsetPlanOut:
    job = job_service.get_visible_job(session, job_id=job_id, principal=principal)
    return plans.offset_plan(session, job)


@router.get(f"{JOB}/plans/swap", response_model=SwapPlanOut, responses=PLAN_NOT_FOUND,
            summary="The swap plan: allocations to offload to host and prefetch, with copy times (from an "
                    "allocation trace)")
def get_swap_plan(job_id: str, principal: JobReaderAuth, session: SessionDep) -> SwapPlanOut:
    job = job_service.get_visible_job(session, job_id=job_id, principal=principal)
    return plans.swap_plan(session, job)


# Last of the job routes: a GET that none of them took. Most often an id whose '/' was sent bare; say how to write it.
@router.get(JOB + "/{rest:path}", include_in_schema=False)
def unknown_job_route(job_id: str, rest: str) -> None:
    raise NotFound(f"no such route under job {job_id!r}; a job id with '/' is written %2F in a path "
                   f"({job_path(f'{job_id}/{rest}')})")


def _rightsizing(session: Session, job: Job, settings: ServerSettings, history: int,
                 principal: Principal) -> dict[str, Any]:
    """The recommendation from `job` and the earlier runs of its name and team, all from cached reports; the
    other GPU types' projections calibrated by the visible runs of its model where they ran on both types."""
    if not report_store.has_report(session, job):
        report_store.compute_report(session, job, settings)
    runs = rightsizing_history(session, job, limit=history)
    result = rightsize([r for _, r in runs], fingerprint_runs=visible_fingerprint_runs(session, job, principal),
                       fleet_pairs=visible_fleet_pairs(session, principal))
    return {"job_id": job.job_id, "name": job.name, "team": job.team, "history_job_ids": [j for j, _ in runs],
            **result}


# A scheduler about to launch the next run of a recurring job has no job id for it yet: it asks by name.
recurring_router = APIRouter(prefix="/api/v1", tags=["jobs"])


@recurring_router.get("/rightsizing", response_model=RightsizingOut,
                      responses={404: {"description": "no visible run of that name"}},
                      summary="Right-sizing for the next run of a recurring job, by its name (and team)")
def get_rightsizing_by_name(principal: JobReaderAuth, session: SessionDep, settings: SettingsDep,
                            name: str = Query(..., min_length=1, max_length=500,
                                              description="the recurring job's name, as its runs registered it"),
                            team: str | None = Query(None, max_length=100, description=(
                                "its team (a team token: its own, the default); else the team of the latest run")),
                            history: int = Query(50, ge=1, le=500, description="past runs of that name to use"),
                            ) -> dict[str, Any]:
    job = job_service.latest_visible_run(session, name=name, team=team, principal=principal)
    return _rightsizing(session, job, settings, history, principal)
