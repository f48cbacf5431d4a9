"""Feeds `NodeGauges` from the calls the sampler makes anyway: a `Devices` wrapper that passes every call through
and keeps what it returned, and an `Attributor` that notes which job each GPU process was attributed to. The
exporter so costs no NVML call of its own, and the sampler does not know it is there.

A GPU's job labels are those of the processes seen at its previous full reading: the sampler lists a GPU's
processes right after reading it, so the set is complete when the next reading of that GPU begins.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from agent.attribution import Attribution, Attributor
from agent.devices.base import Devices, GpuIdentity, GpuLostError, GpuProcess, GpuReading, NodeFacts
from agent.exporter.gauges import NodeGauges, Workload, hpc_job_of
from agent.podresources import PodRef


class JobsSeen:
    """Job ids seen on each GPU since its last full reading, and the pod the kubelet says holds it."""

    def __init__(self, gauges: NodeGauges, pods_of_gpu: Callable[[str], set[PodRef]] | None = None):
        self.gauges = gauges
        self.pods_of_gpu = pods_of_gpu
        self._slot = {g.uuid: g.slot for g in gauges.gpus}
        self._pending: list[set[str]] = [set() for _ in gauges.gpus]

    def note(self, gpu_uuid: str | None, job_id: str | None) -> None:
        slot = self._slot.get(gpu_uuid) if gpu_uuid is not None else None
        if slot is not None and job_id is not None:
            self._pending[slot].add(job_id)

    def close_interval(self, slot: int) -> None:
        """A new full reading of GPU `slot` begins: what was noted since the last one becomes its labels."""
        jobs, self._pending[slot] = self._pending[slot], set()
        pods = self.pods_of_gpu(self.gauges.gpus[slot].uuid) if self.pods_of_gpu is not None else set()
        pod = next(iter(pods)) if len(pods) == 1 else None
        self.gauges.set_workload(slot, Workload(
            namespace=pod.namespace if pod else None, pod=pod.name if pod else None,
            container=(pod.container or None) if pod else None, hpc_job=hpc_job_of(jobs)))


class ObservedDevices(Devices):
    """`inner`, with every reading also given to the gauges."""

    def __init__(self, inner: Devices, gauges: NodeGauges, jobs: JobsSeen):
        self.inner = inner
        self.gauges = gauges
        self.jobs = jobs
        self.source = inner.source
        self.local_pids = inner.local_pids

    def node_facts(self) -> NodeFacts:
        return self.inner.node_facts()

    def gpus(self) -> list[GpuIdentity]:
        return self.inner.gpus()

    def read(self, slot: int) -> GpuReading:
        self.jobs.close_interval(slot)
        try:
            reading = self.inner.read(slot)
        except GpuLostError:
            self.gauges.mark_lost(slot)
            raise
        self.gauges.update_reading(slot, reading)
        return reading

    def read_fast(self, slot: int) -> tuple[int | None, int | None]:
        memory, power = self.inner.read_fast(slot)
        self.gauges.update_fast(slot, memory, power)
        return memory, power

    def processes(self, slot: int) -> list[GpuProcess]:
        procs = self.inner.processes(slot)
        uuid = self.gauges.gpus[slot].uuid
        for p in procs:
            self.jobs.note(uuid, p.job_id)  # a replay knows its jobs; live processes go through the attributor
        return procs

    def xid_events(self) -> list[tuple[int, int]]:
        events = self.inner.xid_events()
        for slot, xid in events:
            self.gauges.note_xid(slot, xid)
        return events

    def power_limit_constraints_mw(self, slot: int) -> tuple[int, int]:
        return self.inner.power_limit_constraints_mw(slot)

    def set_power_limit_mw(self, slot: int, limit_mw: int) -> None:
        self.inner.set_power_limit_mw(slot, limit_mw)

    def power_limit_mw(self, slot: int) -> int | None:
        return self.inner.power_limit_mw(slot)

    def close(self) -> None:
        self.inner.close()


class ObservedAttributor(Attributor):
    """The agent's attributor, noting each attribution for the GPU's `hpc_job` label."""

    def __init__(self, proc_root: str | Path = "/proc", *,
                 pod_resources_socket: str | Path = "/var/lib/kubelet/pod-resources/kubelet.sock",
                 parent_depth: int = 3):
        super().__init__(proc_root, pod_resources_socket=pod_resources_socket, parent_depth=parent_depth)
        self.jobs: JobsSeen | None = None

    def attribute(self, pid: int, gpu_uuid: str | None = None) -> Attribution:
        found = super().attribute(pid, gpu_uuid)
        if self.jobs is not None:
            self.jobs.note(gpu_uuid, found.job_id)
        return found
