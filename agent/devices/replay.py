"""Plays a `Recording` (nvidia-smi CSV log or fleetprof JSONL) as if it were a live node.

At wall time t after start the device reports the recorded timestep whose offset from the recording's start
is the latest one <= t * speed, looping when `loop` is set. Everything downstream (fast sampling, spool,
shipper) runs exactly as with NVML; batches are labelled `source="replay"` so nobody mistakes them for live
telemetry. Recorded process rows keep their recorded job ids: their pids are not this host's.
"""

from __future__ import annotations

import bisect
import time
from collections.abc import Callable

from agent.devices.base import Devices, GpuIdentity, GpuProcess, GpuReading, NodeFacts
from agent.recordings import ProcessRow, Recording, iter_timesteps

_W_TO_MW = 1000.0
_J_TO_MJ = 1000.0
_BYTES_PER_KIB = 1024.0


class ReplayDevices(Devices):
    source = "replay"
    local_pids = False

    def __init__(self, recording: Recording, *, clock: Callable[[], float] = time.monotonic, speed: float = 1.0,
                 loop: bool = True):
        self._rec = recording
        self._clock = clock
        self._speed = speed
        self._loop = loop
        self._t0 = clock()
        steps = list(iter_timesteps(recording))
        self._offsets = [group[0].ts - recording.start_ts for group in steps]
        self._steps = [{row.gpu_uuid: row.values for row in group} for group in steps]
        gaps = [b - a for a, b in zip(self._offsets, self._offsets[1:])]
        # one loop lasts the recording plus one typical gap, so the last step is shown as long as the others
        self._period_s = (self._offsets[-1] + (sorted(gaps)[len(gaps) // 2] if gaps else 1.0)) or 1.0
        self._ids = [
            GpuIdentity(
                slot=slot, index=g.index, uuid=g.uuid, name=g.name, memory_total_bytes=g.memory_total_bytes,
                pci_bus_id=g.pci_bus_id, mig_parent_uuid=g.mig_parent_uuid, power_source=g.power_source,
                power_limit_mw=None if g.power_limit_w is None else int(g.power_limit_w * _W_TO_MW),
                default_power_limit_mw=None if g.tdp_w is None else int(g.tdp_w * _W_TO_MW),
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
            loops, elapsed = divmod(elapsed, self._period_s)
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

        energy = v.get("energy_counter_j")
        if energy is not None:
            energy = energy + loops * self._energy_per_loop_j.get(self._ids[slot].uuid, 0.0)
        power = num("power_w", _W_TO_MW)
        return GpuReading(
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
        )

    def processes(self, slot: int) -> list[GpuProcess]:
        if not self._proc_offsets:
            return []
        _, offset, _ = self._position()
        k = bisect.bisect_right(self._proc_offsets, offset) - 1
        if k < 0:
            return []
        uuid = self._ids[slot].uuid
        return [GpuProcess(p.pid, p.used_memory_bytes, job_id=p.job_id,
                           attribution="recording" if p.job_id else None)
                for p in self._procs[self._proc_offsets[k]] if p.gpu_uuid == uuid]
