"""GPUs needing attention: health findings per GPU over a recent window, from one SQL aggregate over the window's
raw samples grouped by GPU (counts per slowdown kind, counter rises, flags, XIDs), so no sample reaches Python; the
findings themselves are `server.analysis.health.window`'s. Columns the table does not have yet (health counters
added later) are left out of the aggregate, not guessed."""

from __future__ import annotations

from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from fleetprof.api_models import GpuAttention
from fleetprof.report import HealthFinding
from server.analysis.health.findings import COUNTERS, FLAGS
from server.analysis.health.reasons import POWER_CAP, THERMAL
from server.analysis.health.window import SEVERITY_ORDER, window_findings, worst_severity
from server.db import epoch_column
from server.models import Gpu, GpuSample, Node
from server.models.base import from_epoch

ATTENTION_WINDOW_S = 3600.0  # "recent": the last hour, at most the window asked for


def _aggregate_columns(session: Session) -> list[Any]:
    t = GpuSample.__table__
    tr = t.c.throttle_reasons
    ts = epoch_column(session, t.c.ts)
    thermal = tr.op("&")(THERMAL) != 0
    power = tr.op("&")(POWER_CAP) != 0
    cols: list[Any] = [
        func.count().label("samples"), func.min(ts).label("first_ts"), func.max(ts).label("last_ts"),
        # one kind per sample, as health.reasons.slowdown_masks: thermal, then power cap, then a bare HW slowdown
        func.count().filter(thermal).label("thermal_samples"),
        func.count().filter(power & ~thermal).label("power_cap_samples"),
        func.count().filter((tr.op("&")(0x8) != 0) & ~thermal & ~power).label("hw_slowdown_samples"),
        func.min(t.c.xid_last).label("xid_min"), func.max(t.c.xid_last).label("xid_max"),
    ]
    for column, *_ in COUNTERS:
        if column in t.c:
            cols.append((func.max(t.c[column]) - func.min(t.c[column])).label(f"{column}_rise"))
    for column, *_ in FLAGS:
        if column in t.c:
            cols.append(func.max(t.c[column]).label(f"{column}_max"))
    return cols


def gpus_needing_attention(session: Session, *, now: float, window_s: float = ATTENTION_WINDOW_S,
                           node: str | None = None) -> dict[str, list[HealthFinding]]:
    """uuid -> findings over [now - window_s, now], for the GPUs with any (of `node` alone when given)."""
    t = GpuSample.__table__
    stmt = (select(t.c.gpu_id, *_aggregate_columns(session))
            .where(t.c.ts >= from_epoch(now - window_s), t.c.ts <= from_epoch(now)).group_by(t.c.gpu_id))
    if node is not None:
        stmt = stmt.where(t.c.gpu_id.in_(select(Gpu.id).join(Node, Node.id == Gpu.node_id).where(Node.name == node)))
    rows = {r["gpu_id"]: dict(r) for r in session.execute(stmt).mappings()}
    if not rows:
        return {}
    uuids = dict(session.execute(select(Gpu.id, Gpu.uuid).where(Gpu.id.in_(list(rows)))).tuples().all())
    out = {}
    for gpu_id, agg in rows.items():
        findings = window_findings(uuids[gpu_id], agg, window_s=window_s)
        if findings:
            out[uuids[gpu_id]] = findings
    return out


def attention_list(session: Session, *, now: float, window_s: float = ATTENTION_WINDOW_S) -> list[GpuAttention]:
    """The fleet's GPUs with findings, most severe first, with their node and index."""
    found = gpus_needing_attention(session, now=now, window_s=window_s)
    if not found:
        return []
    where = session.execute(select(Gpu.uuid, Gpu.index, Gpu.name, Node.name).join(Node, Node.id == Gpu.node_id)
                            .where(Gpu.uuid.in_(list(found)))).tuples().all()
    out = [GpuAttention(node=node, gpu_uuid=uuid, gpu_index=index, gpu_name=name, severity=worst_severity(found[uuid]),
                        findings=found[uuid]) for uuid, index, name, node in where]
    out.sort(key=lambda a: (SEVERITY_ORDER.get(a.severity or "info", 3), a.node, a.gpu_index))
    return out
