"""DCGM-exporter-compatible gauges from each GPU's latest sample (no job label: cardinality), and the rollup
backlog."""

from __future__ import annotations

import time

from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from server.models import Gpu, GpuSample, Node, RollupBacklog
from server.models.base import from_epoch

# (DCGM field name, our column, scale to DCGM's unit, help)
DCGM_GAUGES = (
    ("DCGM_FI_DEV_FB_USED", "memory_used_bytes", 1 / 2**20, "Framebuffer memory used (in MiB)."),
    ("DCGM_FI_DEV_POWER_USAGE", "power_w", 1.0, "Power draw (in W)."),
    ("DCGM_FI_DEV_GPU_UTIL", "gpu_util_pct", 1.0, "GPU utilization (in %)."),
    ("DCGM_FI_DEV_MEM_COPY_UTIL", "mem_util_pct", 1.0, "Memory utilization (in %)."),
    ("DCGM_FI_DEV_GPU_TEMP", "temperature_c", 1.0, "GPU temperature (in C)."),
    ("DCGM_FI_DEV_SM_CLOCK", "sm_clock_mhz", 1.0, "SM clock frequency (in MHz)."),
    ("DCGM_FI_DEV_MEM_CLOCK", "mem_clock_mhz", 1.0, "Memory clock frequency (in MHz)."),
    ("DCGM_FI_DEV_XID_ERRORS", "xid_last", 1.0, "Value of the last XID error encountered."),
    ("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "energy_counter_j", 1000.0,
     "Total energy consumption since boot (in mJ)."),
)
STALE_AFTER_S = 300.0


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def fleet_gauges_text(factory: sessionmaker[Session]) -> str:
    with factory() as session:
        latest = (select(GpuSample.gpu_id, func.max(GpuSample.ts).label("ts"))
                  .where(GpuSample.ts >= from_epoch(time.time() - STALE_AFTER_S))
                  .group_by(GpuSample.gpu_id).subquery())
        cols = [GpuSample.__table__.c[c] for _, c, _, _ in DCGM_GAUGES]
        rows = session.execute(
            select(Node.name, Gpu.index, Gpu.uuid, Gpu.name, *cols)
            .join(latest, (GpuSample.gpu_id == latest.c.gpu_id) & (GpuSample.ts == latest.c.ts))
            .join(Gpu, Gpu.id == GpuSample.gpu_id).join(Node, Node.id == Gpu.node_id)
        ).all()
        backlog = session.scalar(select(func.count()).select_from(RollupBacklog))
    lines = ["# HELP fleetprof_rollup_backlog_hours GPU-range hours waiting to be rolled up again (samples that "
             "arrived after the rollup sweep had passed their hour)", "# TYPE fleetprof_rollup_backlog_hours gauge",
             f"fleetprof_rollup_backlog_hours {backlog}"]
    for i, (name, _col, scale, help_text) in enumerate(DCGM_GAUGES):
        lines.append(f"# HELP {name} {help_text}\n# TYPE {name} gauge")
        for node, index, uuid, model, *values in rows:
            value = values[i]
            if value is None:
                continue
            # dcgm-exporter's label set, so its dashboards and alerts work unchanged (no job label: cardinality).
            labels = (f'gpu="{index}",UUID="{_escape(uuid)}",device="nvidia{index}",'
                      f'Hostname="{_escape(node)}",modelName="{_escape(model)}"')
            lines.append(f"{name}{{{labels}}} {value * scale}")
    return "\n".join(lines) + "\n"
