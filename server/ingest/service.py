"""Ingest of agent sample batches and framework event batches: validate, de-duplicate, bulk-write.

Every batch is one transaction: the idempotency row, the inventory, and the rows commit together, and the
request is acknowledged only after that commit (the request boundary commits). A batch seen before is
acknowledged as a duplicate and changes nothing.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import cast

from sqlalchemy import select
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.orm import Session

from fleetprof.protocol import (
    SAMPLE_FIELD_NAMES,
    EventBatch,
    FrameworkInfoEvent,
    JobEndEvent,
    JobStartEvent,
    LayerEvent,
    OomEvent,
    SampleBatch,
    StepEvent,
)
from server.auth.policy import require_node
from server.auth.service import Principal
from server.captures import auto as capture_auto
from server.config import ServerSettings
from server.db import dialect_insert, is_postgres, raw_connection, rowcount
from server.errors import InvalidInput
from server.fleet.service import note_late_samples
from server.jobs import service as job_service
from server.jobs import unseen
from server.jobs.framework_info import note_framework_info
from server.models import (
    TERMINAL_STATES,
    Gpu,
    GpuSample,
    IngestBatch,
    JobEvent,
    JobGpu,
    JobStep,
    LayerStat,
    Node,
    ProcessSample,
)
from server.models.base import from_epoch, utcnow
from server.nodes.service import InventoryCache, NeedsDatabase, sync_node
from server.storage.bulk import insert_ignore

log = logging.getLogger(__name__)



@dataclass(frozen=True)
class IngestResult:
    accepted: int
    duplicate: bool
    jobs_ended: tuple[int, ...] = ()


def _claim_batch(session: Session, *, kind: str, source_id: str, seq: int, rows: int) -> bool:
    """Insert the idempotency row; False when this (kind, source, seq) was committed before."""
    ins = dialect_insert(session)
    stmt = ins(IngestBatch).values(kind=kind, source_id=source_id, seq=seq, rows=rows, received_at=utcnow())
    result = session.execute(stmt.on_conflict_do_nothing())
    return rowcount(result) == 1


def check_timestamps(ts: list[float], *, now: float, max_future_skew_s: float, what: str) -> None:
    if ts and max(ts) > now + max_future_skew_s:
        raise InvalidInput(f"{what}: timestamp {max(ts):.3f} is more than {max_future_skew_s:.0f} s in the future "
                           f"(server time {now:.3f}); check the node's clock")


@dataclass
class PreparedSamples:
    """A validated, authorised sample batch with its GPU ids resolved: ready for the group writer."""

    batch: SampleBatch
    gpu_ids: dict[str, int]


def prepare_samples(session: Session | None, batch: SampleBatch, *, principal: Principal, cache: InventoryCache,
                    now: float, max_future_skew_s: float) -> PreparedSamples:
    """Everything that can reject a batch, before anything of it is written; then the inventory upsert.

    The inventory (node, GPUs) is metadata the agent re-sends with every batch: it is committed on its own,
    by the caller, and is idempotent. With `session=None` nothing but the inventory cache is read (no I/O: the
    collector calls it on the event loop first); NeedsDatabase when a session is needed after all.
    """
    require_node(principal, batch.node)
    cols = batch.samples
    check_timestamps(cols.ts, now=now, max_future_skew_s=max_future_skew_s, what="samples")
    if batch.processes is not None:
        check_timestamps(batch.processes.ts, now=now, max_future_skew_s=max_future_skew_s, what="processes")
    declared = {g.uuid for g in batch.gpus}
    used = set(cols.gpu_uuid) | (set(batch.processes.gpu_uuid) if batch.processes is not None else set())
    if not used <= declared:
        entry = cache.get(batch.node)
        if entry is not None:
            known = set(entry.gpu_ids)
        elif session is None:
            raise NeedsDatabase(batch.node)
        else:
            known = set(session.scalars(select(Gpu.uuid).join(Node, Node.id == Gpu.node_id)
                                        .where(Node.name == batch.node)))
        unknown = used - declared - known
        if unknown:
            raise InvalidInput(f"samples for GPU(s) {sorted(unknown)} that node {batch.node!r} has not reported "
                               f"in `gpus`")
    healthy: dict[str, bool] = {}
    if cols.healthy is not None:
        for uuid, ok in zip(cols.gpu_uuid, cols.healthy, strict=True):
            healthy[uuid] = ok  # the last value in the batch wins
    try:
        gpu_ids = sync_node(session, cache, node=batch.node, agent_id=batch.agent_id, source=batch.source,
                            node_info=batch.node_info, gpus=batch.gpus,
                            dropped_samples_total=batch.dropped_samples_total, clock_skew_s=batch.clock_skew_s,
                            healthy=healthy)
    except NeedsDatabase:
        raise
    except BaseException:
        cache.forget(batch.node)  # the cached ids may name rows a rolled-back transaction created
        raise
    return PreparedSamples(batch, gpu_ids)


def _claim_batches(session: Session, keys: list[tuple[str, int, int]]) -> set[tuple[str, int]]:
    """Insert idempotency rows for (source, seq, rows); return the keys that were new."""
    now = utcnow()
    if is_postgres(session):
        # One statement over arrays: SQLAlchemy's multi-VALUES insert cost ~10 ms to compile per group.
        cur = raw_connection(session).cursor()
        try:
            cur.execute(
                "INSERT INTO ingest_batches (kind, source_id, seq, rows, received_at) "
                "SELECT 'samples', s, q, n, %(now)s FROM unnest(%(s)s::text[], %(q)s::bigint[], %(n)s::int[]) "
                "AS k(s, q, n) ON CONFLICT DO NOTHING RETURNING source_id, seq",
                {"s": [k[0] for k in keys], "q": [k[1] for k in keys], "n": [k[2] for k in keys], "now": now})
            return {(src, seq) for src, seq in cur.fetchall()}
        finally:
            cur.close()
    table = IngestBatch.__table__
    values = sqlite_insert(table).values([dict(kind="samples", source_id=src, seq=seq, rows=n, received_at=now)
                                          for src, seq, n in keys])
    stmt = values.on_conflict_do_nothing().returning(table.c.source_id, table.c.seq)
    return {(src, seq) for src, seq in session.execute(stmt)}


def write_samples(session: Session, items: list[PreparedSamples]) -> list[IngestResult]:
    """Write a group of prepared batches in the caller's transaction: one claim, one bulk insert per table."""
    new = _claim_batches(session, [(p.batch.agent_id, p.batch.seq, len(p.batch.samples)) for p in items])
    results: list[IngestResult] = []
    names = ["gpu_id", "ts", "healthy", *SAMPLE_FIELD_NAMES]
    columns: list[list[object]] = [[] for _ in names]
    taken: set[tuple[str, int]] = set()
    for p in items:
        key = (p.batch.agent_id, p.batch.seq)
        if key not in new or key in taken:  # seen before, or twice in this very group
            results.append(IngestResult(0, True))
            continue
        taken.add(key)
        cols = p.batch.samples
        n = len(cols)
        columns[0].extend(p.gpu_ids[u] for u in cols.gpu_uuid)
        columns[1].extend(cols.ts)
        for i, name in enumerate(names[2:], start=2):
            col = getattr(cols, name)
            columns[i].extend(col if col is not None else [None] * n)
        results.append(IngestResult(n, False))
    if taken:
        keep = [i for i, col in enumerate(columns) if i < 2 or any(v is not None for v in col)]
        stored = insert_ignore(session, GpuSample.__table__, [names[i] for i in keep], [columns[i] for i in keep])
        # the first two columns are gpu_id and ts (SAMPLE_FIELD_NAMES)
        note_late_samples(session, cast("list[int]", columns[0]), cast("list[float]", columns[1]), now=time.time())
        sent = sum(r.accepted for r in results)
        if stored != sent:
            # Samples already stored under another batch key (an agent that lost its sequence state):
            # de-duplicated by the (gpu, ts) key; acknowledged counts stay per batch.
            log.info("group of %d samples: %d were already stored", sent, sent - stored)
        for p in items:
            if (p.batch.agent_id, p.batch.seq) in taken and p.batch.processes is not None and p.batch.processes.ts:
                _ingest_processes(session, p.batch, p.gpu_ids)
    return results


def _ingest_processes(session: Session, batch: SampleBatch, gpu_ids: dict[str, int]) -> None:
    p = batch.processes
    assert p is not None
    gpu_col = [gpu_ids[u] for u in p.gpu_uuid]
    attribution = p.attribution if p.attribution is not None else [None] * len(p.ts)
    insert_ignore(session, ProcessSample.__table__,
                  ["gpu_id", "ts", "pid", "used_memory_bytes", "job_id", "attribution"],
                  [gpu_col, p.ts, p.pid, p.used_memory_bytes, p.job_id, attribution])
    # Attribution over time: extend each (job, GPU) interval to cover what this batch saw.
    seen: dict[tuple[str, int], tuple[float, float]] = {}
    for job_id, gpu_id, ts in zip(p.job_id, gpu_col, p.ts, strict=True):
        if job_id is None:
            continue
        lo, hi = seen.get((job_id, gpu_id), (ts, ts))
        seen[(job_id, gpu_id)] = (min(lo, ts), max(hi, ts))
    for (job_id, gpu_id), (lo, hi) in seen.items():
        job = job_service.get_or_create_observed(session, job_id=job_id, node=batch.node, seen_at=lo)
        first, last = from_epoch(lo), from_epoch(hi)
        assert first is not None and last is not None
        unseen.reopen_if_seen(job, last)
        link = session.scalars(select(JobGpu).where(JobGpu.job_pk == job.id, JobGpu.gpu_id == gpu_id)).first()
        if link is None:
            session.add(JobGpu(job_pk=job.id, gpu_id=gpu_id, first_seen_at=first, last_seen_at=last, source="process"))
            continue
        if link.source == "process":  # a registered link's window is the job's own start and end
            link.first_seen_at = min(link.first_seen_at or first, first)
        # Every link says when the job's processes were last seen on it: server.jobs.unseen ends the jobs not seen.
        link.last_seen_at = max(link.last_seen_at or last, last)


def ingest_events(session: Session, batch: EventBatch, *, principal: Principal, now: float,
                  max_future_skew_s: float, settings: ServerSettings | None = None) -> IngestResult:
    """Store a batch of framework events. With `settings`, the jobs whose steps arrived are checked for a step-time
    regression (server.captures.auto), which may request a capture."""
    check_timestamps([e.ts for e in batch.events], now=now, max_future_skew_s=max_future_skew_s, what="events")
    # Authorise every job first, so that a batch naming another team's job changes nothing.
    jobs = {}
    for job_id in dict.fromkeys(e.job_id for e in batch.events):
        jobs[job_id] = job_service.get_writable_job(session, job_id=job_id, principal=principal)
    if not _claim_batch(session, kind="events", source_id=batch.source_id, seq=batch.seq, rows=len(batch.events)):
        return IngestResult(0, True)

    ins = dialect_insert(session)
    step_rows, layer_rows = [], []
    ended: list[int] = []
    for ev in batch.events:
        job = jobs[ev.job_id]
        if isinstance(ev, StepEvent):
            step_rows.append(dict(job_pk=job.id, rank=ev.rank, step=ev.step, ts=from_epoch(ev.ts), wall_s=ev.wall_s,
                                  device_s=ev.device_s, samples=ev.samples,
                                  allocated_peak_bytes=ev.allocated_peak_bytes,
                                  reserved_peak_bytes=ev.reserved_peak_bytes, memory_source=ev.memory_source))
        elif isinstance(ev, LayerEvent):
            layer_rows.append(dict(job_pk=job.id, rank=ev.rank, step=ev.step, module=ev.module,
                                   module_type=ev.module_type, forward_s=ev.forward_s, backward_s=ev.backward_s,
                                   activation_bytes=ev.activation_bytes, calls=ev.calls))
        else:
            data = ev.model_dump(exclude={"kind", "job_id", "ts", "rank"}, exclude_none=True)
            session.add(JobEvent(job_pk=job.id, kind=ev.kind, ts=from_epoch(ev.ts), rank=ev.rank, data=data))
            if isinstance(ev, JobStartEvent):
                job_service.mark_started(job, ts=ev.ts, host=ev.host, framework=ev.framework)
            elif isinstance(ev, JobEndEvent):
                if job_service.mark_ended(job, ts=ev.ts, exit_code=ev.exit_code, state=ev.state):
                    ended.append(job.id)
            elif isinstance(ev, OomEvent):
                job.extra = {**(job.extra or {}), "oom_seen": True}
            elif isinstance(ev, FrameworkInfoEvent):
                note_framework_info(job, ev)
    # Steps or layers of a job that has already ended change what its final report and plot views were made of:
    # the job counts as updated, so that both are computed again (server.jobs.sweep.jobs_due) and not served stale.
    fed = {r["job_pk"] for r in step_rows + layer_rows}
    for job in jobs.values():
        if job.id in fed and job.state in TERMINAL_STATES:
            job.updated_at = utcnow()
    if step_rows:
        session.execute(ins(JobStep).on_conflict_do_nothing(), step_rows)
    if layer_rows:
        session.execute(ins(LayerStat).on_conflict_do_nothing(), layer_rows)
    session.flush()
    if settings is not None and step_rows:
        first_rank: dict[int, int] = {}  # per job, the lowest rank whose steps arrived: the one watched
        for ev in batch.events:
            if isinstance(ev, StepEvent):
                pk = jobs[ev.job_id].id
                first_rank[pk] = min(first_rank.get(pk, ev.rank), ev.rank)
        for job in jobs.values():
            if job.id in first_rank:
                capture_auto.check_job(session, job=job, rank=first_rank[job.id], settings=settings)
    return IngestResult(len(batch.events), False, tuple(ended))
