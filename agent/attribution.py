"""Which job a GPU process belongs to, from the host's /proc.

In order: `FLEETPROF_JOB_ID` in /proc/PID/environ (set by `fleetprof run`), `SLURM_JOB_ID` there (job id
`slurm:<id>`), the same two in the environment of up to `parent_depth` ancestors (a launcher that scrubbed
its workers' environment), the Kubernetes pod from /proc/PID/cgroup (job id `k8s:pod-<uid>`), else
unattributed (None). The agent needs the host PID namespace (DaemonSet `hostPID: true`) because NVML
reports host pids.

Kubelet pod-resources socket: it maps GPU UUIDs to namespace/pod/container over gRPC. grpcio is not a
dependency of the agent, so this version identifies pods by the cgroup path alone (UID); when the socket is
mounted and grpcio is importable, `PodResources` is the place to add the List() call (TODO).

Results are cached per (pid, start time) so a recycled pid is looked up again.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

_JOB_ID_RE = re.compile(r"^[A-Za-z0-9._:@/+=-]{1,200}$")  # agent.protocol.JobId
# kubepods/burstable/pod<uid>/<ctr> (cgroup v1, cgroupfs) or kubepods-burstable-pod<uid_with_underscores>.slice
_POD_RE = re.compile(r"pod([0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12})")

ENV_JOB = "env:FLEETPROF_JOB_ID"
ENV_SLURM = "env:SLURM_JOB_ID"
K8S_POD = "k8s:pod"


@dataclass(frozen=True)
class Attribution:
    job_id: str | None
    method: str | None  # ENV_JOB, ENV_SLURM, K8S_POD, None (unattributed)


UNATTRIBUTED = Attribution(None, None)


class PodResources:
    """The kubelet pod-resources socket, when mounted. TODO: List() over gRPC when grpcio is installed."""

    def __init__(self, socket_path: str | Path):
        self.socket_path = Path(socket_path)
        self._warned = False

    def available(self) -> bool:
        if not self.socket_path.exists():
            return False
        try:
            import grpc  # noqa: F401
        except ImportError:
            if not self._warned:
                self._warned = True
                log.info("kubelet pod-resources socket %s is mounted but grpcio is not installed: "
                         "pods are identified by cgroup UID only", self.socket_path)
            return False
        return False  # not implemented yet: see the module docstring


class Attributor:
    def __init__(self, proc_root: str | Path = "/proc", *,
                 pod_resources_socket: str | Path = "/var/lib/kubelet/pod-resources/kubelet.sock",
                 parent_depth: int = 3):
        self.proc_root = Path(proc_root)
        self._root = str(self.proc_root)
        self.pod_resources = PodResources(pod_resources_socket)
        self.parent_depth = parent_depth
        self._cache: dict[int, tuple[int | None, Attribution]] = {}

    def attribute(self, pid: int) -> Attribution:
        start = self._start_time(pid)
        cached = self._cache.get(pid)
        if cached is not None and cached[0] == start:
            return cached[1]
        result = self._lookup(pid)
        if start is not None:  # a vanished process is not cached: its pid may come back as another one
            self._cache[pid] = (start, result)
        return result

    def forget_except(self, live_pids: set[int]) -> None:
        """Drop cache entries of processes no longer on any GPU."""
        for pid in [p for p in self._cache if p not in live_pids]:
            del self._cache[pid]

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
        if job and _JOB_ID_RE.match(job):
            return Attribution(job, ENV_JOB)
        if job:
            log.warning("pid %d: FLEETPROF_JOB_ID %r is not a valid job id; ignored", pid, job)
        if slurm and _JOB_ID_RE.match(f"slurm:{slurm}"):
            return Attribution(f"slurm:{slurm}", ENV_SLURM)
        return None

    def _from_cgroup(self, pid: int) -> Attribution | None:
        cgroup = self._read(pid, "cgroup")
        if not cgroup:
            return None
        m = _POD_RE.search(cgroup.decode(errors="replace"))
        if not m:
            return None
        self.pod_resources.available()  # logs once that only the UID is known
        return Attribution(f"k8s:pod-{m.group(1).replace('_', '-')}", K8S_POD)

    def _lookup(self, pid: int) -> Attribution:
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
        return self._from_cgroup(pid) or UNATTRIBUTED
