"""Readers for the real data in tests/data used by the analysis tests (independent of server code)."""

from __future__ import annotations

import csv
import math
from datetime import UTC, datetime
from pathlib import Path

import numpy as np

from server.analysis.base.jobdata import GpuSeries

MIB = 2**20


def _sections(path: Path) -> dict[str, list[str]]:
    """nvidia_gpu_exporter capture → {"load :: dmon": [lines], ...} (section title without the comment)."""
    lines = path.read_text().split("\n")
    out: dict[str, list[str]] = {}
    title = None
    for i, line in enumerate(lines):
        if line.startswith("# ") and " :: " in line and i > 0 and lines[i - 1].startswith("####"):
            title = line[2:].split(" (")[0].strip()
            out[title] = []
        elif title is not None:
            out[title].append(line)
    return out


def _num(s: str) -> float:
    s = s.strip().split(" ")[0]
    try:
        return float(s)
    except ValueError:
        return math.nan  # "-", "[N/A]"


def query_gpu_row(path: Path, phase: str) -> dict[str, str]:
    sec = _sections(path)[f"{phase} :: query-gpu"]
    rows = [r for r in sec if r and not r.startswith("#")]
    header = [h.strip() for h in rows[0].split(",")]
    values = [v.strip() for v in rows[1].split(",")]
    return dict(zip(header, values))


def dmon_rows(path: Path, phase: str) -> list[dict[str, float]]:
    sec = _sections(path)[f"{phase} :: dmon"]
    head = next(r for r in sec if r.startswith("# gpu")).lstrip("# ").split()
    return [dict(zip(head, map(_num, r.split()))) for r in sec if r.strip() and not r.startswith("#")]


def _epoch(stamp: str) -> float:
    return datetime.strptime(stamp, "%Y/%m/%d %H:%M:%S.%f").replace(tzinfo=UTC).timestamp()


def capture_series(path: Path) -> GpuSeries:
    """A replay of one capture: idle dmon rows from the idle query's time, load rows from the load query's,
    one second apart (dmon's default interval); memory from the query rows."""
    ts, power, util, mem_used = [], [], [], []
    for phase in ("idle", "load"):
        q = query_gpu_row(path, phase)
        t0 = _epoch(q["timestamp"])
        for k, r in enumerate(dmon_rows(path, phase)):
            ts.append(t0 + k)
            power.append(r["pwr"])
            util.append(r["sm"])
            mem_used.append(_num(q["memory.used [MiB]"]) * MIB)
    q = query_gpu_row(path, "load")
    cols = {"power_w": np.array(power), "gpu_util_pct": np.array(util),
            "memory_used_bytes": np.array(mem_used)}
    return GpuSeries(uuid=q["uuid"], name=q["name"], memory_total_bytes=int(_num(q["memory.total [MiB]"]) * MIB),
                     ts=np.array(ts), columns=cols, power_source="nvidia-smi:dmon pwr")


def zeus_windows(path: Path) -> list[dict[str, float]]:
    """zeus-profile-data rows: start_time, power limit (from window_name), elapsed_time, gpuN_energy."""
    with open(path) as f:
        rows = list(csv.DictReader(f))
    out = []
    for r in rows:
        rec = {"start_time": float(r["start_time"]), "elapsed_time": float(r["elapsed_time"]),
               "power_limit_w": float(r["window_name"].rsplit("_", 1)[1])}
        for k, v in r.items():
            if k.endswith("_energy"):
                rec[k] = float(v)
        out.append(rec)
    return out
