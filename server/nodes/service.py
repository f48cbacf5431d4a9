"""Nodes and GPUs: upserts from agent batches and job registrations, with an in-process id cache; the inventory
reads of GET /api/v1/nodes and /api/v1/gpus.

Agents send their inventory with every batch; writing it every time would cost a round trip per batch,
so unchanged inventory is only refreshed (last_seen) every `refresh_s` (60 s: last-seen has minute resolution;
a change of inventory, health or drop count is written at once).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from fleetprof.protocol import GpuInfo, NodeInfo
from fleetprof.report import gpm_source_label
from server.analysis.utilization.gpm import MEANS as GPM_MEANS  # (field, gpu_samples column), as the report's
from server.db import epoch_column
from server.errors import NotFound
from server.models import Gpu, GpuSample, Node
from server.models.base import from_epoch, to_epoch, utcnow
from server.nodes.attention import gpus_needing_attention
from server.nodes.schemas import GpuGpmRead, GpuRead, NodeRead


@dataclass
class _NodeEntry:
    node_id: int
    gpu_ids: dict[str, int]
    fingerprint: int
    refreshed_at: float


class InventoryCache:
    def __init__(self, refresh_s: float = 60.0):
        self.refresh_s = refresh_s
        self._nodes: dict[str, _NodeEntry] = {}
        self._lock = threading.Lock()

    def get(self, node: str) -> _NodeEntry | None:
        with self._lock:
            return self._nodes.get(node)

    def put(self, node: str, entry: _NodeEntry) -> None:
        with self._lock:
            self._nodes[node] = entry

    def forget(self, node: str) -> None:
        with self._lock:
            self._nodes.pop(node, None)


def _get_or_create_node(session: Session, name: str) -> Node:
    node = session.scalars(select(Node).where(Node.name == name)).first()
    if node is None:
        node = Node(name=name, dropped_samples_total=0)
        session.add(node)
        session.flush()
    return node


def _apply_gpu(gpu: Gpu, info: GpuInfo) -> None:
    gpu.index = info.index
    gpu.name = info.name
    gpu.memory_total_bytes = info.memory_total_bytes
    gpu.pci_bus_id = info.pci_bus_id
    gpu.mig_parent_uuid = info.mig_parent_uuid
    gpu.power_source = info.power_source
    gpu.power_limit_w = info.power_limit_w
    gpu.max_sm_clock_mhz = info.max_sm_clock_mhz
    gpu.slowdown_temperature_c = info.slowdown_temperature_c


class NeedsDatabase(Exception):
    """Raised by a cache-only inventory lookup (no session given) when the database must be written."""


def sync_node(session: Session | None, cache: InventoryCache, *, node: str, agent_id: str, source: str,
              node_info: NodeInfo | None, gpus: list[GpuInfo], dropped_samples_total: int,
              clock_skew_s: float | None, healthy: dict[str, bool]) -> dict[str, int]:
    """Record the node's inventory; return GPU uuid -> id for every GPU the node has reported.

    With `session=None` only the cache is consulted (no I/O, safe on the event loop): NeedsDatabase when the
    inventory changed or is due for its last-seen refresh.
    """
    fingerprint = hash((agent_id, source, tuple(node_info.__dict__.values()) if node_info else None,
                        tuple(tuple(g.__dict__.values()) for g in gpus), dropped_samples_total,
                        tuple(sorted(healthy.items()))))
    entry = cache.get(node)
    now_mono = time.monotonic()
    if (entry is not None and entry.fingerprint == fingerprint and now_mono - entry.refreshed_at < cache.refresh_s
            and all(g.uuid in entry.gpu_ids for g in gpus)):
        return entry.gpu_ids
    if session is None:
        raise NeedsDatabase(node)

    now = utcnow()
    row = _get_or_create_node(session, node)
    row.last_agent_id = agent_id
    row.last_source = source
    row.last_seen_at = now
    row.dropped_samples_total = max(row.dropped_samples_total or 0, dropped_samples_total)
    row.clock_skew_s = clock_skew_s
    if node_info is not None:
        row.hostname = node_info.hostname or row.hostname
        row.driver_version = node_info.driver_version or row.driver_version
        row.cuda_version = node_info.cuda_version or row.cuda_version
        row.nvml_version = node_info.nvml_version or row.nvml_version
    existing = {g.uuid: g for g in session.scalars(select(Gpu).where(Gpu.node_id == row.id))}
    for info in gpus:
        gpu = existing.get(info.uuid)
        if gpu is None:
            gpu = Gpu(node_id=row.id, uuid=info.uuid, healthy=True)
            session.add(gpu)
            existing[info.uuid] = gpu
        _apply_gpu(gpu, info)
        gpu.last_seen_at = now
        if info.uuid in healthy:
            gpu.healthy = healthy[info.uuid]
    session.flush()
    ids = {uuid: g.id for uuid, g in existing.items()}
    cache.put(node, _NodeEntry(row.id, ids, fingerprint, now_mono))
    return ids


def ensure_gpus(session: Session, *, node: str, uuids: list[str]) -> dict[str, int]:
    """GPU rows for a job registered before its node's agent reported (placeholders until it does)."""
    row = _get_or_create_node(session, node)
    existing = {g.uuid: g for g in session.scalars(select(Gpu).where(Gpu.node_id == row.id))}
    for i, uuid in enumerate(uuids):
        if uuid not in existing:
            gpu = Gpu(node_id=row.id, uuid=uuid, index=i, name="unknown", healthy=True)
            session.add(gpu)
            existing[uuid] = gpu
    session.flush()
    return {u: existing[u].id for u in uuids}


def _gpu_read(gpu: Gpu, node: str) -> GpuRead:
    return GpuRead(node=node, uuid=gpu.uuid, index=gpu.index, name=gpu.name, memory_total_bytes=gpu.memory_total_bytes,
                   pci_bus_id=gpu.pci_bus_id, mig_parent_uuid=gpu.mig_parent_uuid, power_source=gpu.power_source,
                   power_limit_w=gpu.power_limit_w, healthy=gpu.healthy, last_seen_at=to_epoch(gpu.last_seen_at),
                   max_sm_clock_mhz=gpu.max_sm_clock_mhz, slowdown_temperature_c=gpu.slowdown_temperature_c)


def list_nodes(session: Session) -> list[NodeRead]:
    counts: dict[int, int] = {}
    for (node_id,) in session.execute(select(Gpu.node_id)):
        counts[node_id] = counts.get(node_id, 0) + 1
    return [NodeRead(name=n.name, hostname=n.hostname, driver_version=n.driver_version, cuda_version=n.cuda_version,
                     nvml_version=n.nvml_version, source=n.last_source, gpu_count=counts.get(n.id, 0),
                     dropped_samples_total=n.dropped_samples_total or 0, clock_skew_s=n.clock_skew_s,
                     last_seen_at=to_epoch(n.last_seen_at))
            for n in session.scalars(select(Node).order_by(Node.name))]


def list_gpus(session: Session, *, node: str | None = None) -> list[GpuRead]:
    """Every GPU (of `node` alone when given), by node name and index."""
    stmt = select(Gpu, Node.name).join(Node, Node.id == Gpu.node_id).order_by(Node.name, Gpu.index)
    if node is None:
        return [_gpu_read(g, name) for g, name in session.execute(stmt)]
    found = gpus_needing_attention(session, now=time.time(), node=node)
    return [_gpu_read(g, name).model_copy(update={"findings": found.get(g.uuid, [])})
            for g, name in session.execute(stmt.where(Node.name == node))]


def gpu_gpm(session: Session, *, node: str, window_s: float, now: float) -> list[GpuGpmRead]:
    """The GPM means of each of `node`'s GPUs over the last `window_s` seconds (one grouped read; the ts BRIN
    index narrows it to the window's pages). The window is bounded by the router."""
    row = session.scalars(select(Node).where(Node.name == node)).first()
    if row is None:
        raise NotFound(f"node {node!r} is not known")
    gpus = list(session.scalars(select(Gpu).where(Gpu.node_id == row.id).order_by(Gpu.index)))
    t = GpuSample.__table__
    since = from_epoch(now - window_s)
    stats: dict[int, Any] = {}
    if gpus:
        stmt = (select(t.c.gpu_id, func.count(t.c.gpm_sm_activity_pct), func.max(epoch_column(session, t.c.ts)),
                       *(func.avg(t.c[col]) for _, col in GPM_MEANS))
                .where(t.c.gpu_id.in_([g.id for g in gpus]), t.c.ts >= since,
                       t.c.gpm_sm_activity_pct.is_not(None))
                .group_by(t.c.gpu_id))
        stats = {r[0]: r for r in session.execute(stmt)}
    label = gpm_source_label(row.last_source)
    out = []
    for g in gpus:
        r = stats.get(g.id)
        means = {name: (None if r is None or r[3 + i] is None else float(r[3 + i]))
                 for i, (name, _) in enumerate(GPM_MEANS)}
        out.append(GpuGpmRead(node=node, uuid=g.uuid, index=g.index, window_s=window_s,
                              samples=0 if r is None else int(r[1]),
                              last_ts=None if r is None or r[2] is None else float(r[2]),
                              source=label if r is not None else None, **means))
    return out
