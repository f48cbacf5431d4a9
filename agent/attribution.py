"""Which job a GPU process belongs to, from the host's /proc.

In order: `FLEETPROF_JOB_ID` in /proc/PID/environ (set by `fleetprof run`), `SLURM_JOB_ID` there (job id
`slurm:<id>`), the same two in the environment of up to `parent_depth` ancestors (a launcher that scrubbed
its workers' environment), then Kubernetes for a process whose cgroup is a pod's (or unreadable): the pod the
kubelet's pod-resources API says holds the process's GPU (job id `k8s:<namespace>/<pod>`, agent/podresources.py)
when exactly one pod holds it, else the pod UID from /proc/PID/cgroup (job id `k8s:pod-<uid>`); else
unattributed (None). The agent needs the host PID namespace
(DaemonSet `hostPID: true`) because NVML reports host pids.

Results are cached per process, so a recycled pid is looked up again: where the agent reads its own /proc (the
usual case, `hostPID`), a pidfd held per cached process says, in one poll, whether that very process has
exited (os.pidfd_open, Linux 5.3+); elsewhere (another /proc mounted at `proc_root`, or no pidfd) each call
compares the process's start time in /proc/PID/stat, three syscalls and a parse per process and interval.
"""

from __future__ import annotations

import logging
import os
import re
import select
from dataclasses import dataclass
from pathlib import Path

from agent.podresources import PodResources
from fleetprof.jobid import is_job_id

log = logging.getLogger(__name__)

# kubepods/burstable/pod<uid>/<ctr> (cgroup v1, cgroupfs) or kubepods-burstable-pod<uid_with_underscores>.slice
_POD_RE = re.compile(r"pod([0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12})")

ENV_JOB = "env:FLEETPROF_JOB_ID"
ENV_SLURM = "env:SLURM_JOB_ID"
K8S_POD = "k8s:pod"
K8S_POD_RESOURCES = "k8s:pod-resources"


def slurm_job_id(slurm_id: str) -> str | None:
    """The job id of Slurm job `slurm_id` (SLURM_JOB_ID: for an array task its own id, not the array's):
    `slurm:<id>`, or None when that is not a valid job id. The one rule for the agent, `fleetprof run` and the
    Slurm prolog/epilog, so that all three name the same job."""
    job_id = f"slurm:{slurm_id.strip()}"
    return job_id if slurm_id.strip() and is_job_id(job_id) else None


@dataclass(frozen=True)
class Attribution:
    job_id: str | None
    method: str | None  # ENV_JOB, ENV_SLURM, K8S_POD, None (unattributed)


UNATTRIBUTED = Attribution(None, None)


class Attributor:
    def __init__(self, proc_root: str | Path = "/proc", *,
                 pod_resources_socket: str | Path = "/var/lib/kubelet/pod-resources/kubelet.sock",
                 parent_depth: int = 3):
        self.proc_root = Path(proc_root)
        self._root = str(self.proc_root)
        self.pod_resources = PodResources(pod_resources_socket)
        self.parent_depth = parent_depth
        self._cache: dict[int, tuple[int | None, Attribution]] = {}
        # pid -> a pidfd of the process whose attribution is cached (only where /proc is this namespace's own)
        self._pidfds: dict[int, int] = {}
        self._use_pidfd = hasattr(os, "pidfd_open") and os.path.realpath(self._root) == "/proc"

    def attribute(self, pid: int, gpu_uuid: str | None = None) -> Attribution:
        """The job of process `pid`, seen on GPU `gpu_uuid` (which the pod-resources lookup needs)."""
        fd = self._pidfds.get(pid)
        if fd is not None:
            if not select.select((fd,), (), (), 0)[0]:  # readable once the process has exited
                return self._cache[pid][1]
            self._forget(pid)
        start = self._start_time(pid)
        cached = self._cache.get(pid)
        if cached is not None and cached[0] == start:
            return cached[1]
        result = self._lookup(pid, gpu_uuid)
        if start is not None:  # a vanished process is not cached: its pid may come back as another one
            self._cache[pid] = (start, result)
            self._hold(pid, start)
        return result

    def _hold(self, pid: int, start: int) -> None:
        """A pidfd of `pid`, if it is still the process started at `start` (the one just looked up)."""
        if not self._use_pidfd:
            return
        try:
            fd = os.pidfd_open(pid)
        except OSError:  # gone meanwhile, or pidfds not allowed here: the start time is compared instead
            return
        if self._start_time(pid) != start:  # the pid was recycled between the lookup and the open
            os.close(fd)
            return
        self._pidfds[pid] = fd

    def _forget(self, pid: int) -> None:
        self._cache.pop(pid, None)
        fd = self._pidfds.pop(pid, None)
        if fd is not None:
            os.close(fd)

    def forget_except(self, live_pids: set[int]) -> None:
        """Drop cache entries (and pidfds) of processes no longer on any GPU."""
        for pid in [p for p in self._cache if p not in live_pids]:
            self._forget(pid)

    def close(self) -> None:
        """Release the pidfds."""
        self.forget_except(set())

    # ------------------------------------------------------------------------------------------ lookups

    def _read(self, pid: int, name: str) -> bytes | None:
        try:
            with open(f"{self._root}/{pid}/{name}", "rb") as f:
                return f.read()
        except (FileNotFoundError, ProcessLookupError, NotADirectoryError):
            return None
        except PermissionError:
            log.debug("no permission to read /proc/%d/%s", pid, name)
            return None
        except OSError as exc:
            log.debug("reading /proc/%d/%s: %s", pid, name, exc)
            return None

    def _start_time(self, pid: int) -> int | None:
        stat = self._read(pid, "stat")
        if not stat:
            return None
        # comm may hold spaces and parentheses: fields after the last ')' start at field 3 (state)
        fields = stat[stat.rfind(b")") + 2:].split()
        try:
            return int(fields[19])  # field 22, starttime
        except (IndexError, ValueError):
            return None

    def _parent(self, pid: int) -> int | None:
        status = self._read(pid, "status")
        if not status:
            return None
        m = re.search(rb"^PPid:\s*(\d+)", status, re.MULTILINE)
        return int(m.group(1)) if m else None

    def _from_environ(self, pid: int) -> Attribution | None:
        env = self._read(pid, "environ")
        if not env:
            return None
        job = slurm = None
        for entry in env.split(b"\0"):
            if entry.startswith(b"FLEETPROF_JOB_ID="):
                job = entry[17:].decode(errors="replace")
            elif entry.startswith(b"SLURM_JOB_ID="):
                slurm = entry[13:].decode(errors="replace")
        if job and is_job_id(job):
            return Attribution(job, ENV_JOB)
        if job:
            log.warning("pid %d: FLEETPROF_JOB_ID %r is not a valid job id; ignored", pid, job)
        if slurm and (slurm_id := slurm_job_id(slurm)):
            return Attribution(slurm_id, ENV_SLURM)
        return None

    def _from_kubernetes(self, pid: int, gpu_uuid: str | None) -> Attribution | None:
        """The pod of the process: named by the kubelet when exactly one pod holds its GPU (several do with
        time-slicing), else by the UID in its cgroup path. A process whose cgroup shows no pod is in none: a
        host process on a pod's GPU is not the pod's."""
        cgroup = self._read(pid, "cgroup")
        m = _POD_RE.search(cgroup.decode(errors="replace")) if cgroup else None
        if cgroup and m is None:
            return None
        if gpu_uuid is not None:
            pods = {(p.namespace, p.name): p for p in self.pod_resources.pods_of_gpu(gpu_uuid)}
            if len(pods) == 1 and is_job_id(job_id := next(iter(pods.values())).job_id):
                return Attribution(job_id, K8S_POD_RESOURCES)
        return Attribution(f"k8s:pod-{m.group(1).replace('_', '-')}", K8S_POD) if m else None

    def _lookup(self, pid: int, gpu_uuid: str | None = None) -> Attribution:
        found = self._from_environ(pid)
        ancestor = pid
        for _ in range(self.parent_depth):
            if found is not None:
                return found
            parent = self._parent(ancestor)
            if parent is None or parent <= 1:
                break
            ancestor = parent
            found = self._from_environ(ancestor)
        if found is not None:
            return found
        return self._from_kubernetes(pid, gpu_uuid) or UNATTRIBUTED
