"""GPUs needing attention: health findings per GPU over a recent window, kept cheap for a fleet of 10,000 GPUs:

- slowdown seconds per kind, and seconds near the slowdown temperature, from the hourly rollups (`gpu_hourly`,
  re-rolled every few minutes) of the hours the window touches: one aggregate over a row per GPU and hour;
- XIDs, error counters and flags from each GPU's first and last raw sample in the window that read them: primary-key
  probes per GPU (LIMIT 1 each; the health counters, read every 30th sample, walk back at most that many rows), as the
  fleet summary reads each GPU's latest utilization; no window of samples is scanned (bench/attention_probes.py,
  1,000 GPUs x 1 h at 1 Hz on 2 shared cores: 81 ms, against 27 ms for the single null-blind pair these replaced,
  which found none of the 10 GPUs whose counters rose).

The findings themselves are `server.analysis.health.window`'s. Columns the table does not have are left out, not
guessed."""

from __future__ import annotations

from typing import Any

from sqlalchemy import and_, func, or_, select, true
from sqlalchemy.orm import Session

from fleetprof.api_models import GpuAttention
from fleetprof.report import HealthFinding
from server.analysis.fleet.rollup import NEAR_SLOWDOWN_FIELD, SLOWDOWN_FIELDS
from server.analysis.health.findings import COUNTERS, FLAGS
from server.analysis.health.window import SEVERITY_ORDER, window_findings, worst_severity
from server.db import is_postgres
from server.models import Gpu, GpuHourly, GpuSample, Node
from server.models.base import from_epoch

ATTENTION_WINDOW_S = 3600.0  # "recent": the last hour, at most the window asked for
HOUR_S = 3600.0


# Read at every sample; the other COUNTERS and FLAGS columns come with the health counters, every 30th sample
# (agent/devices/nvml.py HEALTH_EVERY) and null between: their probes look for the first and last sample that read them.
EVERY_SAMPLE = ("xid_last", "ecc_corrected_total", "ecc_uncorrected_total")


def _probe_groups() -> list[list[str]]:
    """The probed columns the table has, grouped by the cadence the agent reads them at."""
    t = GpuSample.__table__
    wanted = [c for c in dict.fromkeys(["xid_last", *(c for c, *_ in COUNTERS), *(c for c, *_ in FLAGS)])
              if c in t.c]
    groups = [[c for c in wanted if c in EVERY_SAMPLE], [c for c in wanted if c not in EVERY_SAMPLE]]
    return [g for g in groups if g]


def _first_last(session: Session, gpu_ids: Any, *, since: float, until: float) -> dict[int, dict[str, Any]]:
    """gpu_id -> `<column>_first` / `<column>_last` of its first and last sample in [since, until] that read the
    column (a group of columns read together: one probe each way)."""
    t = GpuSample.__table__
    in_window = and_(t.c.gpu_id == Gpu.id, t.c.ts >= from_epoch(since), t.c.ts <= from_epoch(until))
    if is_postgres(session):
        stmt = select(Gpu.id).select_from(Gpu)
        for i, cols in enumerate(_probe_groups()):
            read = and_(in_window, or_(*(t.c[c].isnot(None) for c in cols)))
            first = select(*(t.c[c].label(f"{c}_first") for c in cols)).where(read).order_by(t.c.ts.asc()) \
                .limit(1).lateral(f"first_{i}")
            last = select(*(t.c[c].label(f"{c}_last") for c in cols)).where(read).order_by(t.c.ts.desc()) \
                .limit(1).lateral(f"last_{i}")
            # outer: a GPU without the group's fields (unsupported: all null) still gives its other probes
            stmt = stmt.add_columns(*first.c, *last.c).join(first, true(), isouter=True) \
                .join(last, true(), isouter=True)
    else:  # SQLite (embedded, one node): a correlated probe per column
        def probe(c: str, order: Any, label: str) -> Any:
            return select(t.c[c]).where(in_window, t.c[c].isnot(None)).order_by(order).limit(1) \
                .scalar_subquery().label(label)

        cols = [c for g in _probe_groups() for c in g]
        stmt = select(Gpu.id, *(probe(c, t.c.ts.asc(), f"{c}_first") for c in cols),
                      *(probe(c, t.c.ts.desc(), f"{c}_last") for c in cols)).select_from(Gpu)
    stmt = stmt.where(Gpu.id.in_(gpu_ids))
    return {r["id"]: dict(r) for r in session.execute(stmt).mappings()}


def gpus_needing_attention(session: Session, *, now: float, window_s: float = ATTENTION_WINDOW_S,
                           node: str | None = None) -> dict[str, list[HealthFinding]]:
    """uuid -> findings over [now - window_s, now], for the GPUs with any (of `node` alone when given)."""
    gpus = select(Gpu.id).join(Node, Node.id == Gpu.node_id)
    if node is not None:
        gpus = gpus.where(Node.name == node)
    since = now - window_s
    h = GpuHourly.__table__
    hours = session.execute(
        select(h.c.gpu_id, func.sum(h.c.covered_s).label("covered_s"),
               *(func.sum(h.c[f]).label(f) for f in (*SLOWDOWN_FIELDS, NEAR_SLOWDOWN_FIELD)))
        .where(h.c.hour >= from_epoch(since - since % HOUR_S), h.c.hour < from_epoch(now), h.c.gpu_id.in_(gpus))
        .group_by(h.c.gpu_id)).mappings().all()
    agg: dict[int, dict[str, Any]] = {r["gpu_id"]: dict(r) for r in hours}
    for gpu_id, probes in _first_last(session, gpus, since=since, until=now).items():
        agg.setdefault(gpu_id, {}).update(probes)
    if not agg:
        return {}
    known = {gpu_id: (uuid, source) for gpu_id, uuid, source in session.execute(
        select(Gpu.id, Gpu.uuid, Node.last_source).join(Node, Node.id == Gpu.node_id)
        .where(Gpu.id.in_(list(agg)))).tuples()}
    out = {}
    for gpu_id, values in agg.items():
        uuid, source = known[gpu_id]
        findings = window_findings(uuid, values, window_s=window_s, sample_source=source)
        if findings:
            out[uuid] = findings
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
