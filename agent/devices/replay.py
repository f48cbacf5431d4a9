"""Plays a `Recording` (nvidia-smi CSV log or fleetprof JSONL) through the node agent. Two modes:

- `--source replay:FILE` (`ReplayDevices`): *as if live*. At wall time t after start the device reports the
  recorded timestep whose offset from the recording's start is the latest one <= t * speed, looping when
  `loop` is set. Everything downstream (fast sampling, spool, shipper) runs exactly as with NVML: samples get
  the agent's own clock and the per-interval mean/max of its fast sampling.
- `--source replay-original:FILE` (`OriginalReplayDevices` + `RecordedSampler`): the recording's *own*
  timestamps and values. Each sampling interval ships the next recorded timestep, one sample per recorded
  row, verbatim (no mean/max re-aggregation, no clock of ours), as fast as the interval allows, once (no
  loop). It delivers a recording (e.g. a spool copied off a GPU node) through the real agent path (spool,
  shipper, retries) so that what the collector stores equals the recording row for row.

Batches are labelled `source="replay"` so nobody mistakes them for live telemetry. Recorded process rows keep
their recorded job ids: their pids are not this host's.
"""

from __future__ import annotations

import bisect
import logging
import math
import time
from collections.abc import Callable
from itertools import pairwise

from agent.devices.base import Devices, GpuIdentity, GpuProcess, GpuReading, NodeFacts
from fleetprof.protocol import GPM_FIELDS, HEALTH_COUNTER_FIELDS, SampleBatch
from fleetprof.recordings import ProcessRow, Recording, SampleRow, iter_timesteps, make_batch

log = logging.getLogger(__name__)

_W_TO_MW = 1000.0
_J_TO_MJ = 1000.0
_BYTES_PER_KIB = 1024.0


class ReplayDevices(Devices):
    source = "replay"
    local_pids = False

    def __init__(self, recording: Recording, *, clock: Callable[[], float] = time.monotonic, speed: float = 1.0,
                 loop: bool = True, job_id: str | None = None):
        self._rec = recording
        self._job_id = job_id  # for processes the recording did not attribute
        self._clock = clock
        self._speed = speed
        self._loop = loop
        self._t0 = clock()
        steps = list(iter_timesteps(recording))
        self._offsets = [group[0].ts - recording.start_ts for group in steps]
        self._steps = [{row.gpu_uuid: row.values for row in group} for group in steps]
        gaps = [b - a for a, b in pairwise(self._offsets)]
        # one loop lasts the recording plus one typical gap, so the last step is shown as long as the others
        self._period_s = (self._offsets[-1] + (sorted(gaps)[len(gaps) // 2] if gaps else 1.0)) or 1.0
        self._ids = [
            GpuIdentity(
                slot=slot, index=g.index, uuid=g.uuid, name=g.name, memory_total_bytes=g.memory_total_bytes,
                pci_bus_id=g.pci_bus_id, mig_parent_uuid=g.mig_parent_uuid, power_source=g.power_source,
                power_limit_mw=None if g.power_limit_w is None else int(g.power_limit_w * _W_TO_MW),
                default_power_limit_mw=None if g.tdp_w is None else int(g.tdp_w * _W_TO_MW),
                max_sm_clock_mhz=g.max_sm_clock_mhz, slowdown_temperature_c=g.slowdown_temperature_c,
            )
            for slot, g in enumerate(recording.gpus)
        ]
        self._procs: dict[float, list[ProcessRow]] = {}
        for p in recording.processes:
            self._procs.setdefault(p.ts - recording.start_ts, []).append(p)
        self._proc_offsets = sorted(self._procs)
        first = next((s for s in self._steps if any(v.get("energy_counter_j") is not None for v in s.values())), {})
        last = next((s for s in reversed(self._steps)
                     if any(v.get("energy_counter_j") is not None for v in s.values())), {})
        # per loop, the energy counter moves on by what one pass of the recording consumed
        self._energy_per_loop_j = {u: (last[u].get("energy_counter_j") or 0) - (first[u].get("energy_counter_j") or 0)
                                   for u in first if u in last}

    @property
    def recording(self) -> Recording:
        return self._rec

    def _position(self) -> tuple[int, float, int]:
        """(timestep index, offset within the recording, completed loops)."""
        elapsed = (self._clock() - self._t0) * self._speed
        loops = 0
        if self._loop:
            whole, elapsed = divmod(elapsed, self._period_s)
            loops = int(whole)
        i = max(0, bisect.bisect_right(self._offsets, elapsed) - 1)
        return i, elapsed, int(loops)

    def node_facts(self) -> NodeFacts:
        n = self._rec.node_info
        if n is None:
            return NodeFacts()
        return NodeFacts(driver_version=n.driver_version, cuda_version=n.cuda_version, nvml_version=n.nvml_version)

    def gpus(self) -> list[GpuIdentity]:
        return list(self._ids)

    def _values(self, slot: int) -> tuple[dict[str, float | int | None], int]:
        i, _, loops = self._position()
        return self._steps[i].get(self._ids[slot].uuid, {}), loops

    def read_fast(self, slot: int) -> tuple[int | None, int | None]:
        v, _ = self._values(slot)
        mem = v.get("memory_used_bytes")
        power = v.get("power_w")
        return (None if mem is None else int(mem)), (None if power is None else int(power * _W_TO_MW))

    def read(self, slot: int) -> GpuReading:
        v, loops = self._values(slot)

        def num(name: str, scale: float = 1.0) -> float | None:
            x = v.get(name)
            return None if x is None else float(x) * scale

        def whole(name: str) -> int | None:
            x = v.get(name)
            return None if x is None else int(x)

        def whole_scaled(name: str, scale: float) -> int | None:
            x = num(name, scale)
            return None if x is None else int(x)

        energy = v.get("energy_counter_j")
        if energy is not None:
            energy = energy + loops * self._energy_per_loop_j.get(self._ids[slot].uuid, 0.0)
        power = num("power_w", _W_TO_MW)
        reading = GpuReading(
            memory_used_bytes=whole("memory_used_bytes"), memory_total_bytes=whole("memory_total_bytes"),
            memory_reserved_bytes=whole("memory_reserved_bytes"), gpu_util_pct=num("gpu_util_pct"),
            mem_util_pct=num("mem_util_pct"), power_mw=None if power is None else int(power),
            energy_mj=None if energy is None else int(energy * _J_TO_MJ), temperature_c=num("temperature_c"),
            sm_clock_mhz=num("sm_clock_mhz"), mem_clock_mhz=num("mem_clock_mhz"),
            throttle_reasons=whole("throttle_reasons"),
            pcie_tx_kib_per_s=num("pcie_tx_bytes_per_s", 1 / _BYTES_PER_KIB),
            pcie_rx_kib_per_s=num("pcie_rx_bytes_per_s", 1 / _BYTES_PER_KIB),
            nvlink_tx_kib_per_s=num("nvlink_tx_bytes_per_s", 1 / _BYTES_PER_KIB),
            nvlink_rx_kib_per_s=num("nvlink_rx_bytes_per_s", 1 / _BYTES_PER_KIB),
            ecc_corrected_total=whole("ecc_corrected_total"), ecc_uncorrected_total=whole("ecc_uncorrected_total"),
            power_limit_mw=whole_scaled("power_limit_w", _W_TO_MW), app_sm_clock_mhz=num("app_sm_clock_mhz"),
            app_mem_clock_mhz=num("app_mem_clock_mhz"),
        )
        # GPM and health counters as recorded (absent from the recording: None)
        for name in GPM_FIELDS:
            setattr(reading, name, num(name))
        for name in HEALTH_COUNTER_FIELDS:
            setattr(reading, name, whole(name))
        return reading

    def processes(self, slot: int) -> list[GpuProcess]:
        if not self._proc_offsets:
            return []
        _, offset, _ = self._position()
        k = bisect.bisect_right(self._proc_offsets, offset) - 1
        if k < 0:
            return []
        uuid = self._ids[slot].uuid
        return [GpuProcess(p.pid, p.used_memory_bytes, job_id=p.job_id or self._job_id,
                           attribution="recording" if p.job_id else ("replay" if self._job_id else None))
                for p in self._procs[self._proc_offsets[k]] if p.gpu_uuid == uuid]


class OriginalReplayDevices(ReplayDevices):
    """A recording played with its own timestamps: `next_timestep()` hands out each recorded timestep once.

    The `Devices` readings (`read`, `read_fast`, `processes`) still answer as-if-live replay does, so the
    inventory and anything that only reads devices work unchanged; the agent ships through `RecordedSampler`.
    """

    def __init__(self, recording: Recording, *, clock: Callable[[], float] = time.monotonic):
        super().__init__(recording, clock=clock, loop=False)
        self._groups = list(iter_timesteps(recording))
        self._next = 0
        self._procs_sorted = sorted(recording.processes, key=lambda p: p.ts)
        self._proc_ts = [p.ts for p in self._procs_sorted]

    @property
    def steps_total(self) -> int:
        return len(self._groups)

    @property
    def steps_played(self) -> int:
        return self._next

    @property
    def finished(self) -> bool:
        return self._next >= len(self._groups)

    def next_timestep(self) -> tuple[list[SampleRow], list[ProcessRow]] | None:
        """The next recorded timestep's rows (one per GPU) and the process rows recorded since the previous
        timestep (up to and including this one's timestamp; the first step also takes any earlier ones, the
        last one any later ones, so every recorded process row is shipped exactly once). None at the end."""
        if self.finished:
            return None
        i = self._next
        self._next += 1
        rows = self._groups[i]
        lo = 0 if i == 0 else bisect.bisect_right(self._proc_ts, self._groups[i - 1][0].ts)
        hi = len(self._proc_ts) if self.finished else bisect.bisect_right(self._proc_ts, rows[0].ts)
        return rows, self._procs_sorted[lo:hi]


class RecordedSampler:
    """The `Sampler` interface over `OriginalReplayDevices`: each `sample()` takes the next recorded timestep
    as is; `make_batch()` turns what was taken since the last batch into one batch with the next seq."""

    def __init__(self, devices: OriginalReplayDevices, *, node: str, agent_id: str,
                 clock: Callable[[], float] = time.time):
        self.devices = devices
        self.node = node
        self.agent_id = agent_id
        self.clock = clock
        self.seq = 0
        self._rows: list[SampleRow] = []
        self._procs: list[ProcessRow] = []
        self._announced_end = False

    @property
    def pending_samples(self) -> int:
        return len(self._rows)

    @property
    def finished(self) -> bool:
        return self.devices.finished

    def tick_fast(self) -> None:
        """Nothing to do: the recorded values already carry whatever peaks the recording agent saw."""

    def sample(self, between: Callable[[], None] | None = None) -> None:
        step = self.devices.next_timestep()
        if step is None:
            if not self._announced_end:
                self._announced_end = True
                log.info("end of the recording: %d timesteps played with their original timestamps; the agent "
                         "keeps shipping what is spooled until it is stopped", self.devices.steps_total)
            return
        rows, procs = step
        self._rows.extend(rows)
        self._procs.extend(procs)

    def make_batch(self, *, dropped_samples_total: int = 0, clock_skew_s: float | None = None) -> SampleBatch | None:
        rows, procs = self._rows, self._procs
        if not rows:
            return None  # process rows are cut with the samples of their timestep, never alone
        self._rows, self._procs = [], []
        self.seq += 1
        batch = make_batch(rows, rec=self.devices.recording, node=self.node, agent_id=self.agent_id, seq=self.seq,
                           sent_at=self.clock(), source=self.devices.source, processes=procs)
        batch.dropped_samples_total = dropped_samples_total
        if clock_skew_s is not None and math.isfinite(clock_skew_s):
            batch.clock_skew_s = clock_skew_s
        return batch
