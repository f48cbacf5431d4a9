"""Generate the synthetic health recordings beside this file (fleetprof JSONL, what `ReplayDevices` and `fleetprof
replay` read) and their ground truth, from a schedule written here, not from fleetprof's analyzers.

    PYTHONPATH=. python tests/synthetic/generate_health.py   # rewrites *.jsonl and *.truth.json

`throttled_straggler.jsonl` — a 4-GPU synchronous data-parallel job on an H100 node, 1 Hz NVML samples. Each
iteration every GPU computes for `COMPUTE_S` at the full SM clock, then all wait for the slowest and run the
all-reduce (`COMM_S`). GPU 2 is thermally throttled in the `THROTTLE` intervals: SW thermal slowdown (0x20, plus HW
thermal 0x40 at the hottest), SM clock `THROTTLED_CLOCK_MHZ`, so its compute phase lasts COMPUTE_S x max/throttled
clock and the others wait for it, idle (their idle bit 0x1 is set while they wait). Its throttled seconds are the
length of those intervals (the truth file says so).

`idle_bits.jsonl` — one GPU that sits idle most of the time: GPU-idle (0x1) with the application-clocks bit (0x2)
and sync boost (0x10) set, low clocks, a short busy burst now and then. None of those bits is a slowdown.

Labelled synthetic: the node is named `synthetic-health`, the recording's power source says so.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from fleetprof.protocol import PROTOCOL_VERSION, GpuInfo, NodeInfo, SampleBatch, SampleColumns

HERE = Path(__file__).resolve().parent
START_TS = 1_793_491_200.0  # 2026-11-01 00:00:00 UTC
DURATION_S = 1500
GPUS = 4
STRAGGLER = 2
COMPUTE_S = 6.0
COMM_S = 2.0
MAX_CLOCK_MHZ = 1980.0
THROTTLED_CLOCK_MHZ = 1400.0
THROTTLE = ((300.0, 700.0), (900.0, 1100.0))  # offsets (s) where GPU 2 is throttled: 600 s in all
HW_THERMAL_FROM = 600.0  # within the first interval, the HW thermal bit joins from here
IDLE, APP_CLOCKS, SYNC_BOOST, SW_THERMAL, HW_THERMAL = 0x1, 0x2, 0x10, 0x20, 0x40
NAME = "NVIDIA H100 80GB HBM3"


def _uuid(i: int, family: int = 0) -> str:
    return f"GPU-5e0a1c00-0000-4000-8000-{family:06d}00000{i}"


def throttled_at(t: float) -> bool:
    return any(a <= t < b for a, b in THROTTLE)


@dataclass
class Phases:
    """Per GPU, the intervals [start, end) it computes, communicates, or waits, over the whole run."""

    compute: list[list[tuple[float, float]]]
    comm: list[tuple[float, float]]


def schedule() -> Phases:
    compute: list[list[tuple[float, float]]] = [[] for _ in range(GPUS)]
    comm: list[tuple[float, float]] = []
    t = 0.0
    while t < DURATION_S:
        ends = []
        for g in range(GPUS):
            slow = g == STRAGGLER and throttled_at(t)
            length = COMPUTE_S * (MAX_CLOCK_MHZ / THROTTLED_CLOCK_MHZ if slow else 1.0)
            compute[g].append((t, t + length))
            ends.append(t + length)
        sync = max(ends)
        comm.append((sync, sync + COMM_S))
        t = sync + COMM_S
    return Phases(compute=compute, comm=comm)


def _overlap(intervals: list[tuple[float, float]], lo: float, hi: float) -> float:
    return sum(max(0.0, min(b, hi) - max(a, lo)) for a, b in intervals)


def _inside(intervals: list[tuple[float, float]], t: float) -> bool:
    return any(a <= t < b for a, b in intervals)


def throttled_rows() -> list[dict[str, object]]:
    """One row per (sample instant, GPU) with protocol field names."""
    ph = schedule()
    rng = np.random.default_rng(20)
    rows = []
    for k in range(DURATION_S):
        t = float(k)
        for g in range(GPUS):
            # NVML utilization.gpu: the share of the last sample period (1 s) a kernel ran
            computed = _overlap(ph.compute[g], t - 1.0, t)
            reduced = _overlap(ph.comm, t - 1.0, t)
            util = float(np.clip(100.0 * (computed + reduced) + rng.normal(0, 1.0), 0, 100))
            slow = g == STRAGGLER and throttled_at(t)
            computing = _inside(ph.compute[g], t)
            waiting = not computing and not _inside(ph.comm, t)
            reasons = IDLE if waiting else 0
            if slow:
                reasons |= SW_THERMAL | (HW_THERMAL if HW_THERMAL_FROM <= t < THROTTLE[0][1] else 0)
            clock = THROTTLED_CLOCK_MHZ if slow else (MAX_CLOCK_MHZ if not waiting else 1755.0)
            # compute draws most, the all-reduce's kernels less, waiting least
            power = 90.0 + 560.0 * computed * (0.75 if slow else 1.0) + 160.0 * reduced + rng.normal(0, 8.0)
            temp = (87.0 if slow else 62.0 + 0.1 * g) + rng.normal(0, 0.5)
            rows.append({"ts": START_TS + t, "gpu": g, "gpu_util_pct": round(util, 1),
                         "mem_util_pct": round(util * 0.4, 1), "power_w": round(max(power, 60.0), 1),
                         "temperature_c": round(temp, 1), "sm_clock_mhz": clock, "mem_clock_mhz": 2619.0,
                         "throttle_reasons": reasons, "memory_used_bytes": 61_000_000_000 + g * 1_000_000,
                         "memory_total_bytes": 85_520_809_984, "power_limit_w": 700.0})
    return rows


def idle_rows() -> list[dict[str, object]]:
    rng = np.random.default_rng(21)
    rows = []
    for k in range(900):
        t = float(k)
        burst = k % 300 < 20  # a 20-s burst of work every 5 minutes
        reasons = 0 if burst else IDLE | APP_CLOCKS | SYNC_BOOST
        util = float(np.clip((90.0 if burst else 0.0) + rng.normal(0, 1.0), 0, 100))
        rows.append({"ts": START_TS + t, "gpu": 0, "gpu_util_pct": round(util, 1), "mem_util_pct": 0.0,
                     "power_w": round((400.0 if burst else 70.0) + rng.normal(0, 3.0), 1),
                     "temperature_c": round(40.0 + rng.normal(0, 0.5), 1),
                     "sm_clock_mhz": 1980.0 if burst else 345.0, "mem_clock_mhz": 2619.0 if burst else 405.0,
                     "throttle_reasons": reasons, "memory_used_bytes": 1_000_000_000,
                     "memory_total_bytes": 85_520_809_984, "power_limit_w": 700.0})
    return rows


FIELDS = ("gpu_util_pct", "mem_util_pct", "power_w", "temperature_c", "sm_clock_mhz", "mem_clock_mhz",
          "throttle_reasons", "memory_used_bytes", "memory_total_bytes", "power_limit_w")


def write_recording(path: Path, rows: list[dict[str, object]], gpus: int, *, family: int = 0,
                    per_line: int = 10) -> None:
    infos = [GpuInfo(uuid=_uuid(i, family), index=i, name=NAME, memory_total_bytes=85_520_809_984,
                     power_source="synthetic:tests/synthetic/generate_health.py", power_limit_w=700.0, tdp_w=700.0)
             for i in range(gpus)]
    lines = []
    step = per_line * gpus
    for seq, lo in enumerate(range(0, len(rows), step)):
        chunk = rows[lo:lo + step]
        cols = {"ts": [r["ts"] for r in chunk], "gpu_uuid": [_uuid(int(r["gpu"]), family) for r in chunk],  # type: ignore
                **{f: [r[f] for r in chunk] for f in FIELDS}}
        batch = SampleBatch(protocol_version=PROTOCOL_VERSION, node="synthetic-health", agent_id=f"synthetic-health-{family}",
                            seq=seq, sent_at=float(chunk[-1]["ts"]), source="replay",  # type: ignore[arg-type]
                            node_info=NodeInfo(hostname="synthetic-health"), gpus=infos,
                            samples=SampleColumns(**cols))
        lines.append(json.dumps(batch.model_dump(mode="json", exclude_none=True), separators=(",", ":")))
    path.write_text("\n".join(lines) + "\n")


def truth() -> dict[str, object]:
    throttled_s = sum(b - a for a, b in THROTTLE)
    return {"gpu_uuids": [_uuid(i) for i in range(GPUS)], "straggler_uuid": _uuid(STRAGGLER),
            "throttled_kind": "thermal", "throttled_s": throttled_s,
            "throttle_intervals_s": [list(x) for x in THROTTLE], "first_throttled_ts": START_TS + THROTTLE[0][0],
            "sm_clock_drop_pct": (1 - THROTTLED_CLOCK_MHZ / MAX_CLOCK_MHZ) * 100, "duration_s": DURATION_S,
            "normal_period_s": COMPUTE_S + COMM_S,
            "throttled_period_s": COMPUTE_S * MAX_CLOCK_MHZ / THROTTLED_CLOCK_MHZ + COMM_S}


def main() -> None:
    write_recording(HERE / "throttled_straggler.jsonl", throttled_rows(), GPUS)
    (HERE / "throttled_straggler.truth.json").write_text(json.dumps(truth(), indent=1) + "\n")
    write_recording(HERE / "idle_bits.jsonl", idle_rows(), 1, family=1)
    (HERE / "idle_bits.truth.json").write_text(json.dumps({"gpu_uuid": _uuid(0, 1), "findings": 0}, indent=1) + "\n")


if __name__ == "__main__":
    main()
