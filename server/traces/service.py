"""Uploaded artefacts: Kineto traces and CUDA memory snapshots (already converted to JSON on the client).

The server never unpickles: a pickle is refused with 415 and a pointer to `fleetprof import-trace`, which
converts it client-side. Blobs are stored under a server-chosen name (job primary key + SHA-256), never a path
derived from the client.
"""

from __future__ import annotations

import gzip
import hashlib
import logging
import os
import pickle
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, get_args

import orjson
from sqlalchemy import select
from sqlalchemy.orm import Session

from fleetprof.report import AllocConfAdvice
from server.analysis.planning.alloc_conf import recommend_alloc_conf
from server.analysis.planning.optimization import optimization_and_plans
from server.analysis.planning.reserved_replay import memory_events_from_allocator, read_memory_events
from server.analysis.traces import alloc_trace
from server.analysis.traces.kineto import StepTime, summarize_trace
from server.analysis.traces.module_spans import read_module_spans
from server.analysis.traces.reader import GZIP_MAGIC, TraceFormatError, TraceTooLargeError, open_trace
from server.analysis.traces.snapshot import SnapshotFormatError, parse_snapshot_json
from server.analysis.traces.snapshot_export import to_torch_snapshot
from server.errors import Conflict, InvalidInput, NotFound, PayloadTooLarge, UnsupportedMediaType
from server.models import Job, Trace

log = logging.getLogger(__name__)

SNAPSHOT_FORMAT = "fleetprof.snapshot.v1"
PICKLE_MAGIC = b"\x80"
SNIFF_BYTES = 64 * 1024


@dataclass(frozen=True)
class StagedUpload:
    path: Path
    size_bytes: int
    sha256: str
    gzipped: bool


def stage(chunks_path: Path, blob_dir: Path) -> StagedUpload:
    digest = hashlib.sha256()
    size = 0
    with open(chunks_path, "rb") as f:
        head = f.read(2)
        f.seek(0)
        while block := f.read(1 << 20):
            digest.update(block)
            size += len(block)
    return StagedUpload(chunks_path, size, digest.hexdigest(), head == GZIP_MAGIC)


def new_temp_file(blob_dir: Path) -> tuple[int, Path]:
    blob_dir.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(prefix=".upload-", dir=blob_dir)
    return fd, Path(name)


def _sniff(upload: StagedUpload, max_bytes: int) -> str:
    """'kineto' | 'snapshot'; refuses pickles and anything that is not JSON."""
    try:
        with open_trace(upload.path, max_bytes=max_bytes) as stream:
            head = stream.read(SNIFF_BYTES)
    except (OSError, EOFError, gzip.BadGzipFile) as exc:
        raise InvalidInput(f"unreadable upload: {exc}") from None
    if head[:1] == PICKLE_MAGIC:
        raise UnsupportedMediaType("this looks like a pickle (a CUDA memory snapshot?): the server never unpickles "
                                   "uploads. Use `fleetprof import-trace JOB_ID FILE`, which converts snapshots to "
                                   "JSON on your side")
    text = head.lstrip()
    if not text.startswith(b"{"):
        raise InvalidInput("upload is not a JSON object (expected a Kineto trace or a fleetprof snapshot JSON)")
    if SNAPSHOT_FORMAT.encode() in head:
        return "snapshot"
    return "kineto"


def _kineto_summary(upload: StagedUpload, max_bytes: int) -> dict[str, Any]:
    try:
        parsed = summarize_trace(upload.path, max_bytes=max_bytes)
        summary = parsed.to_dict()
    except TraceTooLargeError as exc:
        raise PayloadTooLarge(str(exc)) from None
    except (TraceFormatError, ValueError) as exc:
        raise InvalidInput(f"not a readable Kineto trace: {exc}") from None
    if summary.get("counts", {}).get("memory_events"):
        try:
            trace = alloc_trace.from_kineto(upload.path)
            if len(trace.size_bytes):
                device = summary.get("device") or {}
                summary["optimization"], summary["plans"] = optimization_and_plans(
                    trace, observed_reserved_bytes=trace.observed_reserved_bytes,
                    step_boundaries=step_boundaries_s(parsed.steps), gpu_name=device.get("name"),
                    module_spans=read_module_spans(upload.path),
                    alloc_conf=alloc_conf_advice(upload.path, trace.device, device.get("memory_total_bytes")))
        except (ValueError, TraceFormatError) as exc:
            summary.setdefault("notes", []).append(f"no offset plan: {exc}")
    return summary


def step_boundaries_s(steps: list[StepTime]) -> list[float] | None:
    """The `ProfilerStep#N` spans' starts and the last one's end, in seconds on the allocation trace's clock (the
    Kineto clock, microseconds): the iteration structure the swap plan is built on. None without steps."""
    if not steps:
        return None
    ordered = sorted(steps, key=lambda s: s.start_us)
    us = [s.start_us for s in ordered] + [ordered[-1].start_us + ordered[-1].duration_us]
    return [t * alloc_trace.KINETO_TIME_UNIT_S for t in us]


def _snapshot_summary(upload: StagedUpload, max_bytes: int) -> dict[str, Any]:
    with open_trace(upload.path, max_bytes=max_bytes) as stream:
        try:
            doc = orjson.loads(stream.read())
        except (orjson.JSONDecodeError, EOFError, OSError) as exc:
            raise InvalidInput(f"malformed snapshot JSON: {exc}") from None
    try:
        snap = parse_snapshot_json(doc)
    except SnapshotFormatError as exc:
        raise InvalidInput(f"invalid snapshot: {exc}") from None
    summary = snap.to_dict()
    events = snap.allocator_events()
    if events:
        try:
            trace = alloc_trace.from_allocator_events(events)
            if len(trace.size_bytes):
                summary["optimization"], summary["plans"] = optimization_and_plans(
                    trace, observed_reserved_bytes=trace.observed_reserved_bytes, snapshot=summary,
                    alloc_conf=snapshot_alloc_conf_advice(summary, events, snap.busiest_device()))
        except ValueError as exc:
            summary.setdefault("notes", []).append(f"no offset plan: {exc}")
    return summary


def alloc_conf_advice(path: Path, device: str | None, capacity_bytes: int | None) -> AllocConfAdvice | None:
    """Allocator settings compared by simulation on the device's `[memory]` events (the bridge from the
    estimator's simulation to the report: analysis cannot import it); None when the events carry no addresses."""
    devices = [d for d in read_memory_events(path) if d.events]
    chosen = [d for d in devices if d.device == device] or sorted(devices, key=lambda d: -len(d.events))[:1]
    if not chosen:
        return None
    return recommend_alloc_conf(chosen[0].events, capacity_bytes, device=chosen[0].device, trace_name=path.name)


def snapshot_alloc_conf_advice(summary: dict[str, Any], events: list[dict[str, Any]],
                               device: int | None) -> AllocConfAdvice | None:
    """Allocator settings compared by simulation on a snapshot's own allocator history (what `fleetprof run
    --trace-allocator` records), its running totals anchored at the snapshot's allocated and reserved bytes."""
    stats: dict[str, Any] = next((d for d in summary.get("devices") or [] if d.get("device") == device), {})
    name = f"cuda:{device if device is not None else 0}"
    dev = memory_events_from_allocator(events, allocated_after_bytes=stats.get("allocated_bytes"),
                                       reserved_after_bytes=stats.get("reserved_bytes"), device=name)
    if not dev.events:
        return None
    return recommend_alloc_conf(dev.events, None, device=name, trace_name=summary.get("filename"))


def blob_key(job: Job, upload: StagedUpload) -> str:
    """The blob's name under the blob directory: chosen by the server, never derived from the client."""
    return f"{job.id}/{upload.sha256}.json" + (".gz" if upload.gzipped else "")


def store_upload(session: Session, *, job: Job, upload: StagedUpload, blob_dir: Path, filename: str | None,
                 rank: int | None, max_trace_bytes: int, one_per_rank: bool = True) -> tuple[Trace, bool]:
    """Parse, store the blob and the summary; (trace, created). The same bytes uploaded again are a no-op.
    `one_per_rank`: a second Kineto trace of a rank is a Conflict (a live capture's traces are exempt: each capture
    traces its ranks again, and the report shows them per capture)."""
    existing = session.scalars(select(Trace).where(Trace.job_pk == job.id, Trace.sha256 == upload.sha256)).first()
    if existing is not None:
        return existing, False
    kind = _sniff(upload, max_trace_bytes)
    summary = (_kineto_summary if kind == "kineto" else _snapshot_summary)(upload, max_trace_bytes)
    if kind == "kineto":
        rank = rank if rank is not None else summary.get("rank")
        if rank is not None and one_per_rank:
            clash = session.scalars(select(Trace).where(Trace.job_pk == job.id, Trace.kind == "kineto",
                                                        Trace.rank == rank)).first()
            if clash is not None:
                raise Conflict(f"job {job.job_id!r} already has a Kineto trace for rank {rank} "
                               f"({clash.filename}); upload each rank once")
    key = blob_key(job, upload)
    final = blob_dir / key
    final.parent.mkdir(parents=True, exist_ok=True)
    os.replace(upload.path, final)
    safe_name = Path(filename).name[:500] if filename else None
    trace = Trace(job_pk=job.id, kind=kind, filename=safe_name, rank=rank, size_bytes=upload.size_bytes,
                  sha256=upload.sha256, blob_key=key, summary=summary)
    session.add(trace)
    session.flush()
    return trace, True


def discard_unreferenced_blob(session: Session, *, blob_dir: Path, key: str) -> None:
    """Remove a blob that no committed row names: what an upload whose row was refused had moved into place. A
    blob is named by its job and hash (blob_key), so one an identical upload committed keeps its file."""
    if session.scalars(select(Trace.id).where(Trace.blob_key == key).limit(1)).first() is None:
        (blob_dir / key).unlink(missing_ok=True)


# ------------------------------------------------------------------------------------------ downloads (issue #22)
DownloadFormat = Literal["original", "json", "pickle"]
DOWNLOAD_FORMATS: tuple[str, ...] = get_args(DownloadFormat)


@dataclass(frozen=True)
class Download:
    """An artefact as a client opens it elsewhere: a file on disk (sent as stored) or bytes built for the request."""

    media_type: str
    filename: str
    path: Path | None = None
    body: bytes | None = None


def list_traces(session: Session, *, job: Job) -> list[Trace]:
    return list(session.scalars(select(Trace).where(Trace.job_pk == job.id).order_by(Trace.id)))


def get_trace(session: Session, *, job: Job, trace_id: int) -> Trace:
    trace = session.scalars(select(Trace).where(Trace.job_pk == job.id, Trace.id == trace_id)).first()
    if trace is None:  # another job's trace is not found either: ids are not a way into other jobs
        raise NotFound(f"job {job.job_id!r} has no trace {trace_id}")
    return trace


def _safe_name(name: str) -> str:
    """A file name for Content-Disposition: letters, digits, '.', '_', '-' (the rest as '_'), at most 200."""
    return re.sub(r"[^A-Za-z0-9._-]", "_", name)[:200].lstrip(".") or "trace"


def download(trace: Trace, *, job_id: str, blob_dir: Path, fmt: str, max_trace_bytes: int) -> Download:
    """A Kineto trace as uploaded (byte for byte: Perfetto and TensorBoard open `.json` and `.json.gz`); a snapshot
    as the pickle `torch.cuda.memory._dump_snapshot` writes (`pickle`, the default: memory_viz opens it) or as the
    stored JSON (`json`). `original` is what was stored, whatever the kind."""
    if fmt not in DOWNLOAD_FORMATS:
        raise InvalidInput(f"format must be one of {', '.join(DOWNLOAD_FORMATS)}")
    path = blob_dir / trace.blob_key
    if not path.is_file():
        raise NotFound(f"trace {trace.id} of job {job_id!r}: its stored file is missing")
    gz = trace.blob_key.endswith(".gz")
    if trace.kind == "kineto" and fmt == "pickle":
        raise InvalidInput("a Kineto trace downloads as it was uploaded (format original or json), not as a pickle")
    stem = _safe_name(Path(trace.filename).name if trace.filename else f"{job_id}-trace{trace.id}")
    if trace.kind == "snapshot" and fmt == "pickle":
        with open_trace(path, max_bytes=max_trace_bytes) as stream:
            doc = orjson.loads(stream.read())
        base = stem.removesuffix(".gz").removesuffix(".json").removesuffix(".pickle")
        # pickle.dumps of plain dicts, lists, ints and strings we built: writing a pickle runs nothing (reading
        # one does, which is why uploads are never unpickled here)
        return Download(media_type="application/octet-stream", filename=f"{base}.pickle",
                        body=pickle.dumps(to_torch_snapshot(doc), protocol=4))
    name = stem if stem.endswith((".json", ".json.gz")) else stem.removesuffix(".gz") + ".json"
    if gz and not name.endswith(".gz"):
        name += ".gz"
    if not gz and name.endswith(".gz"):
        name = name.removesuffix(".gz")
    return Download(media_type="application/gzip" if gz else "application/json", filename=name, path=path)
