"""GET /metrics/fleet: figures of the whole fleet, read from the database, meant to be scraped ONCE per fleet (one
collector, or the collectors' Service with a single scrape job), unlike /metrics, which is per process.

Always: `fleetprof_rollup_backlog_hours`, and how many nodes and GPUs their agents reported within `STALE_AFTER_S`
(the inventory's last-seen).
With `FLEETPROF_FLEET_METRICS_GPU_GAUGES=true`: each GPU's latest stored sample under dcgm-exporter's names and
labels, what /metrics exported before the agents served their own nodes' series (issue #20); for fleets whose
agents Prometheus cannot reach. No job label (cardinality)."""

from __future__ import annotations

import time
from datetime import datetime
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from server.models import Gpu, GpuSample, Node, RollupBacklog
from server.models.base import from_epoch

# (DCGM field name, type, our column, scale to DCGM's unit, help)
DCGM_GAUGES = (
    ("DCGM_FI_DEV_FB_USED", "gauge", "memory_used_bytes", 1 / 2**20, "Framebuffer memory used (in MiB)."),
    ("DCGM_FI_DEV_POWER_USAGE", "gauge", "power_w", 1.0, "Power draw (in W)."),
    ("DCGM_FI_DEV_GPU_UTIL", "gauge", "gpu_util_pct", 1.0, "GPU utilization (in %)."),
    ("DCGM_FI_DEV_MEM_COPY_UTIL", "gauge", "mem_util_pct", 1.0, "Memory utilization (in %)."),
    ("DCGM_FI_DEV_GPU_TEMP", "gauge", "temperature_c", 1.0, "GPU temperature (in C)."),
    ("DCGM_FI_DEV_SM_CLOCK", "gauge", "sm_clock_mhz", 1.0, "SM clock frequency (in MHz)."),
    ("DCGM_FI_DEV_MEM_CLOCK", "gauge", "mem_clock_mhz", 1.0, "Memory clock frequency (in MHz)."),
    ("DCGM_FI_DEV_XID_ERRORS", "gauge", "xid_last", 1.0, "Value of the last XID error encountered."),
    ("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "counter", "energy_counter_j", 1000.0,
     "Total energy consumption since boot (in mJ)."),
)
STALE_AFTER_S = 300.0


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _gauge(name: str, help_text: str, value: float | int) -> list[str]:
    return [f"# HELP {name} {help_text}", f"# TYPE {name} gauge", f"{name} {value}"]


def fleet_metrics_text(factory: sessionmaker[Session], *, gpu_gauges: bool) -> str:
    since = from_epoch(time.time() - STALE_AFTER_S)
    with factory() as session:
        backlog = session.scalar(select(func.count()).select_from(RollupBacklog))
        # the inventory's last-seen (refreshed by ingest at least every minute): no scan of the samples
        gpus = session.scalar(select(func.count()).select_from(Gpu).where(Gpu.last_seen_at >= since))
        nodes = session.scalar(select(func.count()).select_from(Node).where(Node.last_seen_at >= since))
        rows = _latest_rows(session, since) if gpu_gauges else []
    lines = _gauge("fleetprof_rollup_backlog_hours", "GPU-range hours waiting to be rolled up again (samples that "
                   "arrived after the rollup sweep had passed their hour)", backlog or 0)
    lines += _gauge("fleetprof_fleet_gpus_reporting", f"GPUs (and MIG devices) an agent reported in the last "
                    f"{STALE_AFTER_S:g} s", gpus or 0)
    lines += _gauge("fleetprof_fleet_nodes_reporting", f"Nodes whose agent reported in the last {STALE_AFTER_S:g} s",
                    nodes or 0)
    for i, (name, kind, _col, scale, help_text) in enumerate(DCGM_GAUGES):
        if not rows:
            break
        lines.append(f"# HELP {name} {help_text}\n# TYPE {name} {kind}")
        for node, index, uuid, model, *values in rows:
            value = values[i]
            if value is None:
                continue
            # dcgm-exporter's label set, so its dashboards and alerts work unchanged (no job label: cardinality).
            labels = (f'gpu="{index}",UUID="{_escape(uuid)}",device="nvidia{index}",'
                      f'Hostname="{_escape(node)}",modelName="{_escape(model)}"')
            lines.append(f"{name}{{{labels}}} {value * scale}")
    return "\n".join(lines) + "\n"


def _latest_rows(session: Session, since: datetime) -> list[Any]:
    latest = (select(GpuSample.gpu_id, func.max(GpuSample.ts).label("ts"))
              .where(GpuSample.ts >= since).group_by(GpuSample.gpu_id).subquery())
    cols = [GpuSample.__table__.c[c] for _, _, c, _, _ in DCGM_GAUGES]
    return list(session.execute(
        select(Node.name, Gpu.index, Gpu.uuid, Gpu.name, *cols)
        .join(latest, (GpuSample.gpu_id == latest.c.gpu_id) & (GpuSample.ts == latest.c.ts))
        .join(Gpu, Gpu.id == GpuSample.gpu_id).join(Node, Node.id == Gpu.node_id)
    ).all())
