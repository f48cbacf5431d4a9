"""POST /api/v1/jobs/{job_id}/traces: upload a Kineto trace or a snapshot converted to JSON; GET lists a job's
traces and GET .../traces/{trace_id} downloads one as other tools open it (issue #22)."""

from __future__ import annotations

import os
from typing import Annotated

from fastapi import APIRouter, Path, Query, Request, Response
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import FileResponse

from fleetprof.jobid import job_path
from server.captures import service as capture_service
from server.db import session_scope
from server.deps import EventWriterAuth, JobReaderAuth, SessionDep, SettingsDep
from server.errors import DomainError, PayloadTooLarge
from server.job_paths import JOB
from server.jobs import service as job_service
from server.models.base import to_epoch
from server.traces import service as trace_service
from server.traces.schemas import TraceItem, TraceList, TraceRead
from server.traces.service import DownloadFormat

router = APIRouter(prefix="/api/v1/jobs", tags=["traces"])


@router.post(f"{JOB}/traces", response_model=TraceRead,
             openapi_extra={"requestBody": {"required": True, "content": {
                 "application/json": {"schema": {"type": "object"}},
                 "application/gzip": {"schema": {"type": "string", "format": "binary"}}}}},
             responses={401: {}, 403: {}, 404: {}, 409: {}, 413: {}, 415: {}, 422: {}},
             summary="Upload a PyTorch profiler (Kineto) trace (.json or .json.gz) or a memory snapshot JSON")
async def upload_trace(job_id: str, request: Request, principal: EventWriterAuth, settings: SettingsDep,
                       filename: str | None = Query(None, max_length=500),
                       rank: int | None = Query(None, ge=0, le=1_000_000),
                       capture_id: str | None = Query(None, max_length=40,
                                                      description="the live capture this trace carries")) -> TraceRead:
    factory = request.app.state.sessionmaker

    def authorise() -> None:  # before reading a possibly large body; off the event loop, as all database work
        with session_scope(factory) as session:
            job = job_service.get_writable_job(session, job_id=job_id, principal=principal)
            if capture_id is not None:  # 404 before the body is read: a capture of another job, or none
                capture_service.get_capture(session, job=job, capture_id=capture_id)

    await run_in_threadpool(authorise)
    blob_dir = settings.blob_dir
    fd, tmp = trace_service.new_temp_file(blob_dir)
    try:
        size = 0
        with os.fdopen(fd, "wb") as f:
            async for chunk in request.stream():
                size += len(chunk)
                if size > settings.max_trace_upload_bytes:
                    raise PayloadTooLarge(f"trace upload exceeds the limit of {settings.max_trace_upload_bytes} bytes")
                f.write(chunk)

        def work() -> TraceRead:
            upload = trace_service.stage(tmp, blob_dir)
            key: str | None = None  # where this upload's blob goes once parsed
            try:
                with session_scope(factory) as session:
                    job = job_service.get_writable_job(session, job_id=job_id, principal=principal)
                    key = trace_service.blob_key(job, upload)
                    capture = None if capture_id is None else capture_service.get_capture(
                        session, job=job, capture_id=capture_id)
                    trace, created = trace_service.store_upload(session, job=job, upload=upload, blob_dir=blob_dir,
                                                                filename=filename, rank=rank,
                                                                max_trace_bytes=settings.max_trace_bytes,
                                                                # each capture traces its ranks again
                                                                one_per_rank=capture is None)
                    if capture is not None:
                        capture_service.link_trace(session, capture=capture, trace_id=trace.id)
                    return TraceRead(job_id=job_id, kind=trace.kind, filename=trace.filename, rank=trace.rank,
                                     size_bytes=trace.size_bytes, sha256=trace.sha256, created=created,
                                     capture_id=capture_id,
                                     # the plans' entries are read from GET .../plans/offsets and /plans/swap
                                     summary={k: v for k, v in trace.summary.items() if k != "plans"})
            except DomainError as exc:
                if capture_id is not None and exc.status_code != 404:  # the capture's trace could not be analyzed
                    with session_scope(factory) as session:
                        job = job_service.get_writable_job(session, job_id=job_id, principal=principal)
                        capture_service.fail_analysis(
                            session, capture=capture_service.get_capture(session, job=job, capture_id=capture_id),
                            reason=exc.message)
                if key is not None:
                    with session_scope(factory) as session:
                        trace_service.discard_unreferenced_blob(session, blob_dir=blob_dir, key=key)
                raise
            except BaseException:
                if key is not None:  # the row was refused (flush or commit): no blob without its row
                    with session_scope(factory) as session:
                        trace_service.discard_unreferenced_blob(session, blob_dir=blob_dir, key=key)
                raise

        return await run_in_threadpool(work)
    finally:
        tmp.unlink(missing_ok=True)  # moved into place on success; removed on any failure


@router.get(f"{JOB}/traces", response_model=TraceList, responses={401: {}, 403: {}, 404: {}},
            summary="A job's stored traces and snapshots, with their download paths")
def list_traces(job_id: str, principal: JobReaderAuth, session: SessionDep) -> TraceList:
    job = job_service.get_visible_job(session, job_id=job_id, principal=principal)
    items = []
    for t in trace_service.list_traces(session, job=job):
        formats = ["pickle", "json", "original"] if t.kind == "snapshot" else ["original", "json"]
        items.append(TraceItem(trace_id=t.id, kind=t.kind, filename=t.filename, rank=t.rank, size_bytes=t.size_bytes,
                               sha256=t.sha256, uploaded_at=to_epoch(t.uploaded_at) or 0.0,
                               download_path=job_path(job.job_id, "traces", str(t.id)),
                               download_formats=formats))
    return TraceList(traces=items)


# format=json: a Kineto trace's `traceEvents` document, or a snapshot's `segments` / `device_traces` (memory_viz)
_DOWNLOAD_JSON = {"type": "object", "properties": {"traceEvents": {"type": "array", "items": {"type": "object"}},
                                                  "segments": {"type": "array", "items": {"type": "object"}},
                                                  "device_traces": {"type": "array", "items": {"type": "array"}}}}
DOWNLOAD_CONTENT = {"application/json": {"schema": _DOWNLOAD_JSON},
                    "application/gzip": {"schema": {"type": "string", "format": "binary"}},
                    "application/octet-stream": {"schema": {"type": "string", "format": "binary"}}}


@router.get(f"{JOB}/traces/{{trace_id}}", response_class=Response,
            responses={200: {"content": DOWNLOAD_CONTENT, "description": "the artefact, as an attachment"},
                       401: {}, 403: {}, 404: {}, 422: {}},
            summary="Download a trace: Kineto as uploaded (Perfetto, TensorBoard), a snapshot as torch's pickle "
                    "(memory_viz) or JSON")
def download_trace(job_id: str, trace_id: Annotated[int, Path(ge=1, le=2**63 - 1)], principal: JobReaderAuth,
                   session: SessionDep, settings: SettingsDep,
                   format: Annotated[DownloadFormat | None, Query(description=(
                       "original (as stored), json, or pickle (snapshots: what torch.cuda.memory._dump_snapshot "
                       "writes); default: pickle for a snapshot, original for a Kineto trace"))] = None,
                   ) -> Response:
    job = job_service.get_visible_job(session, job_id=job_id, principal=principal)
    trace = trace_service.get_trace(session, job=job, trace_id=trace_id)
    fmt = format or ("pickle" if trace.kind == "snapshot" else "original")
    if fmt == "json" and trace.kind == "kineto":
        fmt = "original"  # a Kineto trace is JSON already (gzip when uploaded so: browsers and Perfetto open both)
    art = trace_service.download(trace, job_id=job.job_id, blob_dir=settings.blob_dir, fmt=fmt,
                                 max_trace_bytes=settings.max_trace_bytes)
    if art.path is not None:
        return FileResponse(art.path, media_type=art.media_type, filename=art.filename,
                            headers={"X-Content-Type-Options": "nosniff"})
    return Response(art.body or b"", media_type=art.media_type,
                    headers={"Content-Disposition": f'attachment; filename="{art.filename}"'})
