"""Turns device readings into protocol rows and batches: the one place where device units become wire units.

Two cadences:
- `tick_fast()` (every `fast_interval_s`, 10 Hz by default) reads only memory used and power where due (every
  tick for an instantaneous reading, once a second for the driver's 1-s mean: agent/devices/nvml.py), and keeps
  a running mean and max per GPU, so that a memory peak shorter than the shipping interval is not missed
  (`memory_used_max_bytes`, `power_max_w`). A GPU idle at the last full reading (no process listed and
  memory used unchanged since the reading before) is skipped until the next full reading: its row's mean and max
  are the full reading's;
- `sample()` (every `interval_s`) takes a full reading of every GPU, closes the interval's mean/max, lists the
  GPU processes and attributes them to jobs.
Cadence of each shipped field (the device layer decides what it reads when: agent/devices/nvml.py):
- 10 Hz (`read_fast`), aggregated over the interval: memory_used_bytes (mean), memory_used_max_bytes, and
  power_w (mean), power_max_w from the power readings of the interval (10 Hz instantaneous, or the driver's 1-s
  means read once a second);
- every interval (`read`): memory_total_bytes, memory_reserved_bytes, gpu_util_pct, mem_util_pct,
  temperature_c, sm_clock_mhz, mem_clock_mhz, throttle_reasons, nvlink_tx/rx_bytes_per_s (counter deltas
  between readings), ecc_corrected/uncorrected_total, power_limit_w, xid_last, and the processes;
- every 60th interval of a GPU (staggered across GPUs; the first reading too), null in the rows between:
  energy_counter_j and pcie_tx/rx_bytes_per_s, the two expensive calls (a counter or rate from another
  reading would be wrong for the row's timestamp, so it is not repeated);
- every 300th interval: app_sm_clock_mhz and app_mem_clock_mhz (set by administrators, ~1 ms per call); every
  row carries the value last read, at most 300 intervals old;
- every interval where the GPU has GPM (Hopper+): gpm_* over the interval since the previous reading (null at the
  first reading and without GPM);
- every 30th interval (staggered; the first reading too), null in between: the health counters
  (ecc_*_volatile, retired_pages_*, remapped_rows_*, pcie_replay_total, nvlink_errors_total).

`make_batch()` turns the rows gathered since the last batch into one validated SampleBatch. A row that fails
validation (a process whose job id is not one, from a device layer or a recording) is dropped, counted in
`dropped_rows_total` (shipped with every later batch) and logged once per field: one bad row never costs the batch,
nor stops the agent.

Energy is the hardware counter (mJ -> J here); the server integrates deltas of it, never power.
A GPU whose reading raises GpuLostError gets a row with `healthy=false` and nulls; the others carry on.
"""

from __future__ import annotations

import logging
import math
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails

from agent.attribution import Attributor
from agent.devices.base import DeviceError, Devices, GpuLostError, GpuReading
from fleetprof.protocol import (
    GPM_FIELDS,
    HEALTH_COUNTER_FIELDS,
    PCT_FIELDS,
    PROTOCOL_VERSION,
    SAMPLE_FIELDS,
    GpuInfo,
    NodeInfo,
    ProcessColumns,
    SampleBatch,
    SampleColumns,
)

log = logging.getLogger(__name__)

_KIB = 1024.0  # NVML's "KB" throughput units are KiB
_NON_NEGATIVE = frozenset(name for name, _ in SAMPLE_FIELDS) - {"temperature_c"}
_PASSED_THROUGH = (*GPM_FIELDS, *HEALTH_COUNTER_FIELDS)  # GpuReading attributes named as the wire's columns
_Columns = TypeVar("_Columns", bound=BaseModel)
_FIELD_NAMES = tuple(name for name, _ in SAMPLE_FIELDS)


@dataclass
class _Interval:
    """Fast-sampling accumulator of one GPU for the current interval."""

    mem_sum: int = 0
    mem_n: int = 0
    mem_max: int | None = None
    pow_sum: int = 0
    pow_n: int = 0
    pow_max: int | None = None

    def reset(self) -> None:
        self.mem_sum = self.mem_n = self.pow_sum = self.pow_n = 0
        self.mem_max = self.pow_max = None

    def add(self, mem: int | None, power_mw: int | None) -> None:
        if mem is not None:
            self.mem_sum += mem
            self.mem_n += 1
            if self.mem_max is None or mem > self.mem_max:
                self.mem_max = mem
        if power_mw is not None:
            self.pow_sum += power_mw
            self.pow_n += 1
            if self.pow_max is None or power_mw > self.pow_max:
                self.pow_max = power_mw


@dataclass
class _Pending:
    ts: list[float] = field(default_factory=list)
    gpu_uuid: list[str] = field(default_factory=list)
    healthy: list[bool] = field(default_factory=list)
    # one tuple per row, in SAMPLE_FIELDS order, uncleaned: turned into columns (and cleaned) once per batch, where
    # zip(*rows) transposes in C and the columns that are null in every row (the slow fields, most of the time)
    # are skipped whole, instead of 45 appends and checks per GPU and interval
    rows: list[tuple[Any, ...]] = field(default_factory=list)
    procs: dict[str, list[Any]] = field(default_factory=lambda: {
        k: [] for k in ("ts", "gpu_uuid", "pid", "used_memory_bytes", "job_id", "attribution")})


def _scaled(v: float | int | None, factor: float) -> float | None:
    return None if v is None else v * factor


def _clean(name: str, value: float | int | None) -> float | int | None:
    """What a confused driver returns must not cost us the whole batch at validation."""
    if value is None:
        return None
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if name in _NON_NEGATIVE and value < 0:
        return None
    if name in PCT_FIELDS:
        return min(100.0, float(value))
    return value


class Sampler:
    def __init__(self, devices: Devices, *, node: str | None = None, agent_id: str,
                 attributor: Attributor | None = None, clock: Callable[[], float] = time.time):
        self.devices = devices
        self.node = node or socket.gethostname()
        self.agent_id = agent_id
        self.attributor = attributor if attributor is not None else Attributor()
        self.clock = clock
        self.seq = 0
        self.dropped_rows_total = 0  # rows that failed validation, since the start
        self._dropped_fields_logged: set[str] = set()
        self._gpus = devices.gpus()
        self._intervals = [_Interval() for _ in self._gpus]
        self._spare = [_Interval() for _ in self._gpus]  # swapped with _intervals at each full reading
        self._healthy = [True] * len(self._gpus)
        # idle at the last full reading (no process listed, memory used as at the reading before): no 10 Hz ticks
        # until the next full reading, which decides again; memory used at the last full reading, per GPU
        self._idle = [False] * len(self._gpus)
        self._last_mem: list[int | None] = [None] * len(self._gpus)
        self._xid_last: list[int | None] = [None] * len(self._gpus)
        self._pending = _Pending()
        self._row_template: dict[str, Any] = dict.fromkeys(_FIELD_NAMES)
        facts = devices.node_facts()
        self._node_info = NodeInfo(hostname=socket.gethostname(), driver_version=facts.driver_version,
                                   cuda_version=facts.cuda_version, nvml_version=facts.nvml_version)
        self._gpu_info = [
            GpuInfo(uuid=g.uuid, index=g.index, name=g.name, memory_total_bytes=g.memory_total_bytes,
                    pci_bus_id=g.pci_bus_id, mig_parent_uuid=g.mig_parent_uuid, power_source=g.power_source,
                    power_limit_w=None if g.power_limit_mw is None else g.power_limit_mw / 1000,
                    tdp_w=None if g.default_power_limit_mw is None else g.default_power_limit_mw / 1000,
                    max_sm_clock_mhz=g.max_sm_clock_mhz, slowdown_temperature_c=g.slowdown_temperature_c)
            for g in self._gpus
        ]

    @property
    def pending_samples(self) -> int:
        return len(self._pending.ts)

    def _mark(self, slot: int, healthy: bool, exc: Exception | None = None) -> None:
        if self._healthy[slot] != healthy:
            self._healthy[slot] = healthy
            if healthy:
                log.warning("GPU %s is healthy again", self._gpus[slot].uuid)
            else:
                log.error("GPU %s marked unhealthy: %s", self._gpus[slot].uuid, exc)

    # ------------------------------------------------------------------------------------------ sampling

    def tick_fast(self) -> None:
        idle, healthy = self._idle, self._healthy
        for slot, acc in enumerate(self._intervals):
            if idle[slot] or not healthy[slot]:
                continue  # idle: nothing can peak; unhealthy: retried by the full reading, once per interval
            try:
                acc.add(*self.devices.read_fast(slot))
            except GpuLostError as exc:
                self._mark(slot, False, exc)
            except DeviceError as exc:
                log.debug("fast reading of GPU %s failed: %s", self._gpus[slot].uuid, exc)

    def sample(self, between: Callable[[], None] | None = None) -> None:
        """A full reading of every GPU. `between` runs after each GPU: a full reading of a node can take a
        few hundred ms (PCIe throughput alone samples 20 ms per direction), and the daemon uses it to keep
        fast ticks going meanwhile so that peaks are not missed during it."""
        ts = self.clock()
        for slot, xid in self.devices.xid_events():
            self._xid_last[slot] = xid
        pend = self._pending
        live_pids: set[int] = set()
        for slot, gpu in enumerate(self._gpus):
            # the interval closes: its accumulator is this row's, the spare (reset) takes the next ticks
            acc, nxt = self._intervals[slot], self._spare[slot]
            nxt.reset()
            self._intervals[slot], self._spare[slot] = nxt, acc
            try:
                reading: GpuReading | None = self.devices.read(slot)
                self._mark(slot, True)
            except GpuLostError as exc:
                self._mark(slot, False, exc)
                reading = None
            except DeviceError as exc:
                log.warning("reading GPU %s failed: %s", gpu.uuid, exc)
                reading = None
            if between is not None:
                between()
            pend.ts.append(ts)
            pend.gpu_uuid.append(gpu.uuid)
            pend.healthy.append(reading is not None or self._healthy[slot])
            row = self._row_template.copy()  # every field None, in SAMPLE_FIELDS order
            row.update(self._row(slot, reading, acc))
            pend.rows.append(tuple(row.values()))
            self._idle[slot] = False
            if reading is None:
                continue
            mem, self._last_mem[slot] = self._last_mem[slot], reading.memory_used_bytes
            try:
                procs = self.devices.processes(slot)
            except DeviceError as exc:
                log.debug("process list of GPU %s failed: %s", gpu.uuid, exc)
                continue
            # No process and memory unchanged since the previous full reading: skip the 10 Hz reads until the next
            # one (a job starting meanwhile is listed there, and its GPU ticks at 10 Hz from then on)
            self._idle[slot] = not procs and mem is not None and mem == reading.memory_used_bytes
            for p in procs:
                live_pids.add(p.pid)
                job_id, how = p.job_id, p.attribution
                if job_id is None and self.devices.local_pids:
                    a = self.attributor.attribute(p.pid, gpu.uuid)
                    job_id, how = a.job_id, a.method
                pp = pend.procs
                pp["ts"].append(ts)
                pp["gpu_uuid"].append(gpu.uuid)
                pp["pid"].append(p.pid)
                pp["used_memory_bytes"].append(p.used_memory_bytes)
                pp["job_id"].append(job_id)
                pp["attribution"].append(how)
        if self.devices.local_pids:
            self.attributor.forget_except(live_pids)

    def _row(self, slot: int, r: GpuReading | None, acc: _Interval) -> dict[str, float | int | None]:
        if r is None:
            return {"memory_total_bytes": self._gpus[slot].memory_total_bytes, "xid_last": self._xid_last[slot]}
        acc.add(r.memory_used_bytes, r.power_mw)
        mem_mean = acc.mem_sum // acc.mem_n if acc.mem_n else None
        pow_mean = acc.pow_sum / acc.pow_n / 1000 if acc.pow_n else None
        scaled = _scaled
        return {
            "memory_used_bytes": mem_mean,
            "memory_used_max_bytes": acc.mem_max,
            "memory_total_bytes": r.memory_total_bytes if r.memory_total_bytes is not None
            else self._gpus[slot].memory_total_bytes,
            "memory_reserved_bytes": r.memory_reserved_bytes,
            "gpu_util_pct": r.gpu_util_pct,
            "mem_util_pct": r.mem_util_pct,
            "power_w": pow_mean,
            "power_max_w": scaled(acc.pow_max, 1e-3),
            "energy_counter_j": scaled(r.energy_mj, 1e-3),
            "temperature_c": r.temperature_c,
            "sm_clock_mhz": r.sm_clock_mhz,
            "mem_clock_mhz": r.mem_clock_mhz,
            "throttle_reasons": r.throttle_reasons,
            "pcie_tx_bytes_per_s": scaled(r.pcie_tx_kib_per_s, _KIB),
            "pcie_rx_bytes_per_s": scaled(r.pcie_rx_kib_per_s, _KIB),
            "nvlink_tx_bytes_per_s": scaled(r.nvlink_tx_kib_per_s, _KIB),
            "nvlink_rx_bytes_per_s": scaled(r.nvlink_rx_kib_per_s, _KIB),
            "power_limit_w": scaled(r.power_limit_mw, 1e-3),
            "app_sm_clock_mhz": r.app_sm_clock_mhz,
            "app_mem_clock_mhz": r.app_mem_clock_mhz,
            "ecc_corrected_total": r.ecc_corrected_total,
            "ecc_uncorrected_total": r.ecc_uncorrected_total,
            "xid_last": self._xid_last[slot],
            # GPM and the health counters are already in wire units (bytes/s, percent, counts)
            **{name: getattr(r, name) for name in _PASSED_THROUGH},
        }

    # ------------------------------------------------------------------------------------------ batching

    def make_batch(self, *, dropped_samples_total: int = 0, clock_skew_s: float | None = None) -> SampleBatch | None:
        """The rows since the last batch as one validated batch with the next seq; None if there are none."""
        pend, self._pending = self._pending, _Pending()
        if not pend.ts:
            return None
        cols: dict[str, Any] = {"ts": pend.ts, "gpu_uuid": pend.gpu_uuid, "healthy": pend.healthy}
        for name, col in zip(_FIELD_NAMES, zip(*pend.rows, strict=True), strict=True):
            if any(v is not None for v in col):
                cols[name] = [None if v is None else _clean(name, v) for v in col]
        samples = self._valid_rows(SampleColumns, cols, "sample")
        processes = self._valid_rows(ProcessColumns, pend.procs, "process") if pend.procs["ts"] else None
        if samples is None:
            return None
        self.seq += 1
        return SampleBatch(
            protocol_version=PROTOCOL_VERSION, node=self.node, agent_id=self.agent_id, seq=self.seq,
            sent_at=self.clock(), source=self.devices.source,
            node_info=self._node_info, gpus=self._gpu_info, samples=samples, processes=processes,
            dropped_samples_total=dropped_samples_total, dropped_rows_total=self.dropped_rows_total or None,
            clock_skew_s=None if clock_skew_s is None or not math.isfinite(clock_skew_s) else clock_skew_s,
        )

    def _valid_rows(self, model: type[_Columns], cols: dict[str, Any], what: str) -> _Columns | None:
        """`model(**cols)` without the rows that fail validation (None when none is left); those are counted and
        the first of each field logged. An error that is no row's (a column of the wrong length) still raises."""
        try:
            return model(**cols)
        except ValidationError as exc:
            bad: dict[int, ErrorDetails] = {}
            for error in exc.errors():
                loc = error["loc"]
                if len(loc) < 2 or not isinstance(loc[1], int):
                    raise
                bad.setdefault(loc[1], error)
        self.dropped_rows_total += len(bad)
        for first in bad.values():
            field_name = f"{what}.{first['loc'][0]}"
            if field_name not in self._dropped_fields_logged:
                self._dropped_fields_logged.add(field_name)
                log.warning("dropped %d %s row(s): %s %r: %s (counted in dropped_rows_total, %d so far; logged once "
                            "per field)", len(bad), what, field_name, first["input"], first["msg"],
                            self.dropped_rows_total)
        keep = [i for i in range(len(cols["ts"])) if i not in bad]
        if not keep:
            return None
        return model(**{name: None if col is None else [col[i] for i in keep] for name, col in cols.items()})
