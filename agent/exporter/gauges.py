"""The latest value of every exported field of every GPU of this node, and its Prometheus text exposition.

Written by the sampling thread (through `observe.py`, from the readings the sampler takes anyway), read by
scrapes: a scrape costs no NVML call, only the rendering of what is held, and the rendered text is kept until the
next update, so scrapes between two samples cost a lock and a copy.

Each field holds the last value read: the sampler reads some fields at every interval, some every Nth interval
(energy, PCIe) or at the shipping interval only (agent/sampler.py), so a series always shows its latest reading.
A GPU that is lost exports nothing until it answers again (as dcgm-exporter does), a field the GPU does not
support never appears (unknown is no series, never 0).

Labels are dcgm-exporter's: `gpu`, `UUID`, `pci_bus_id`, `device`, `modelName`, `Hostname`, on a MIG device's series
`GPU_I_ID` (its GPU instance) and `GPU_I_PROFILE` ("1g.10gb"; `UUID` stays the MIG device's own), plus `namespace`,
`pod`, `container` when the kubelet's pod-resources API says exactly one pod's container holds the GPU, and
`hpc_job` (the Slurm job id) when exactly one Slurm job runs on it. Data that is not from NVML (the NVML test
double, a replayed recording) carries `source` ("test", "replay") on every series, so it can never be taken for a
real GPU's.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from agent.devices.base import GpuIdentity, GpuReading
from agent.exporter.fields import FIELDS, READING_SOURCES

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
SLURM_PREFIX = "slurm:"


def escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _labels(pairs: Iterable[tuple[str, str | None]]) -> str:
    return ",".join(f'{k}="{escape(v)}"' for k, v in pairs if v is not None)


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() and abs(value) < 2**53 else repr(float(value))


@dataclass(frozen=True)
class Workload:
    """Who holds a GPU, as dcgm-exporter labels it; None = unknown or not exactly one."""

    namespace: str | None = None
    pod: str | None = None
    container: str | None = None
    hpc_job: str | None = None

    def labels(self) -> str:
        return _labels((("namespace", self.namespace), ("pod", self.pod), ("container", self.container),
                        ("hpc_job", self.hpc_job)))


def hpc_job_of(job_ids: Iterable[str]) -> str | None:
    """The Slurm job id when the GPU's processes belong to exactly one Slurm job (`slurm:<id>` -> `<id>`)."""
    slurm = {j[len(SLURM_PREFIX):] for j in job_ids if j.startswith(SLURM_PREFIX)}
    return next(iter(slurm)) if len(slurm) == 1 else None


class NodeGauges:
    def __init__(self, gpus: list[GpuIdentity], *, hostname: str, source: str, agent_id: str,
                 clock: Callable[[], float] = time.time):
        self.gpus = gpus
        self.hostname = hostname
        self.source = source
        self.agent_id = agent_id
        self.clock = clock
        marker = None if source == "nvml" else source
        self._static = [_labels((("gpu", str(g.index)), ("UUID", g.uuid), ("pci_bus_id", g.pci_bus_id),
                                 ("device", f"nvidia{g.index}"), ("modelName", g.name), ("Hostname", hostname),
                                 ("GPU_I_PROFILE", g.mig_profile),
                                 ("GPU_I_ID", None if g.mig_gpu_instance_id is None else str(g.mig_gpu_instance_id)),
                                 ("source", marker)))
                        for g in gpus]
        self._values: list[dict[str, float]] = [{} for _ in gpus]
        self._workload: list[str] = ["" for _ in gpus]
        self._totals: list[float | None] = [None for _ in gpus]
        self._last_sample_ts: float | None = None
        self._lock = threading.Lock()
        self._generation = 0
        self._rendered: tuple[int, bytes] | None = None
        self.scrapes = 0

    # ------------------------------------------------------------------ updates (the sampling thread)

    def update_reading(self, slot: int, reading: GpuReading) -> None:
        fresh: dict[str, float] = {}
        for name in READING_SOURCES:
            # getattr: fields other parts add to GpuReading (GPM, health counters) are read when present
            value = getattr(reading, name, None)
            if value is not None:
                fresh[name] = float(value)
        with self._lock:
            values = self._values[slot]
            values.update(fresh)
            total = reading.memory_total_bytes or self.gpus[slot].memory_total_bytes
            self._totals[slot] = None if total is None else float(total)
            self._set_free(slot)
            self._last_sample_ts = self.clock()
            self._generation += 1

    def update_fast(self, slot: int, memory_used_bytes: int | None, power_mw: int | None) -> None:
        with self._lock:
            values = self._values[slot]
            if not values:
                return  # no full reading yet (or the GPU is lost): nothing to freshen
            if memory_used_bytes is not None:
                values["memory_used_bytes"] = float(memory_used_bytes)
                self._set_free(slot)
            if power_mw is not None:
                values["power_mw"] = float(power_mw)
            self._generation += 1

    def _set_free(self, slot: int) -> None:
        """FB free = total - used, kept consistent with the used figure (which 10 Hz ticks refresh). Under the lock."""
        values, total = self._values[slot], self._totals[slot]
        used = values.get("memory_used_bytes")
        if total is not None and used is not None:
            values["memory_free_bytes"] = max(0.0, total - used)

    def mark_lost(self, slot: int) -> None:
        with self._lock:
            if self._values[slot]:
                self._values[slot] = {}
                self._generation += 1

    def note_xid(self, slot: int, xid: int) -> None:
        with self._lock:
            self._values[slot]["xid_last"] = float(xid)
            self._generation += 1

    def set_workload(self, slot: int, workload: Workload) -> None:
        text = workload.labels()
        with self._lock:
            if self._workload[slot] != text:
                self._workload[slot] = text
                self._generation += 1

    # ------------------------------------------------------------------ exposition (scrapes)

    def render(self) -> bytes:
        with self._lock:
            self.scrapes += 1
            if self._rendered is not None and self._rendered[0] == self._generation:
                return self._rendered[1]
            generation = self._generation
            values = [dict(v) for v in self._values]
            labels = [s + ("," + w if w else "") for s, w in zip(self._static, self._workload, strict=True)]
            last = self._last_sample_ts
        out: list[str] = []
        for field in FIELDS:
            rows = [(labels[slot], v[field.source]) for slot, v in enumerate(values) if field.source in v]
            if not rows:
                continue
            out.append(f"# HELP {field.name} {field.help}")
            out.append(f"# TYPE {field.name} {field.kind}")
            out.extend(f"{field.name}{{{lab}}} {_number(value * field.scale)}" for lab, value in rows)
        info = _labels((("Hostname", self.hostname), ("agent_id", self.agent_id), ("source", self.source)))
        out += ["# HELP fleetprof_agent_info The agent serving these series (source: nvml, test = the NVML test "
                "double, replay = a recording).", "# TYPE fleetprof_agent_info gauge",
                f"fleetprof_agent_info{{{info}}} 1",
                "# HELP fleetprof_agent_gpus GPUs (and MIG devices) this agent samples.",
                "# TYPE fleetprof_agent_gpus gauge", f"fleetprof_agent_gpus {len(self.gpus)}"]
        if last is not None:
            out += ["# HELP fleetprof_agent_last_sample_timestamp_seconds When the latest full reading was taken.",
                    "# TYPE fleetprof_agent_last_sample_timestamp_seconds gauge",
                    f"fleetprof_agent_last_sample_timestamp_seconds {last!r}"]
        body = ("\n".join(out) + "\n").encode()
        with self._lock:
            if self._generation == generation:
                self._rendered = (generation, body)
        return body
