"""`fleetprof run -- CMD ...`: run a training command as a profiled job.

Registers the job (POST /api/v1/jobs, state "running"), starts the command with FLEETPROF_JOB_ID and the
hooks' environment, forwards SIGINT/SIGTERM to it, tees its stderr through (looking for out-of-memory
messages), and marks the job finished / failed / killed / oom with its exit code. The exit status is the
child's, or 128+N when signal N killed it, like a shell. The server is a convenience here, never a
dependency: if it cannot be reached the command runs all the same and a warning says so.

The child runs in its own process group so that a forwarded signal reaches the whole job (torchrun and its
workers) exactly once; the consequence is that it is not the terminal's foreground group, so a job reading
the terminal's stdin would be stopped (training jobs don't).
"""

from __future__ import annotations

import contextlib
import getpass
import logging
import os
import re
import secrets
import shlex
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import IO, Any

from agent.attribution import slurm_job_id
from agent.config import AgentSettings
from fleetprof.client import ApiError, Client

log = logging.getLogger(__name__)

FORWARDED_SIGNALS = (signal.SIGINT, signal.SIGTERM)
# What PyTorch, the CUDA runtime, cuBLAS/cuDNN, XLA and TensorFlow print when device memory runs out.
OOM_RE = re.compile(rb"CUDA out of memory|OutOfMemoryError|CUBLAS_STATUS_ALLOC_FAILED|CUDNN_STATUS_ALLOC_FAILED"
                    rb"|cudaErrorMemoryAllocation|RESOURCE_EXHAUSTED: Out of memory|out of memory"
                    # TensorFlow's ResourceExhaustedError (Keras on TF): "OOM when allocating tensor with shape[...]"
                    rb"|OOM when allocating tensor", re.IGNORECASE)
_OOM_OVERLAP = 64  # bytes kept from the previous chunk so a message split across reads still matches


@dataclass(frozen=True)
class HookTraces:
    """Traces the hooks record on request (`fleetprof run --trace-allocator / --profile`): steps 1..N; 0 = off."""

    alloc_trace_steps: int = 0
    profile_steps: int = 0


@dataclass(frozen=True)
class JobOutcome:
    exit_code: int  # the status `fleetprof run` exits with
    state: str  # finished | failed | killed | oom
    oom_seen: bool


def generate_job_id(user: str, now: float | None = None) -> str:
    """`<user>-<yyyymmdd-HHMMSS>-<4 hex>` (UTC), e.g. `alice-20260714-081238-3f9a`."""
    stamp = datetime.fromtimestamp(time.time() if now is None else now, tz=UTC).strftime("%Y%m%d-%H%M%S")
    safe_user = re.sub(r"[^A-Za-z0-9._-]", "_", user)[:64] or "user"
    return f"{safe_user}-{stamp}-{secrets.token_hex(2)}"


def outcome(returncode: int, oom_seen: bool) -> JobOutcome:
    if returncode < 0:  # killed by a signal
        return JobOutcome(128 - returncode, "oom" if oom_seen else "killed", oom_seen)
    if returncode == 0:
        return JobOutcome(0, "finished", oom_seen)
    return JobOutcome(returncode, "oom" if oom_seen else "failed", oom_seen)


def gpus_from_cuda_visible_devices(value: str | None) -> list[str] | None:
    """The UUIDs named in CUDA_VISIBLE_DEVICES; None when it names indices (the agent resolves those per
    process) or is unset."""
    if not value:
        return None
    uuids = [v.strip() for v in value.split(",") if v.strip().startswith(("GPU-", "MIG-"))]
    return uuids or None


class _StderrTee(threading.Thread):
    """Copies the child's stderr to ours unchanged and notes whether an out-of-memory message went by."""

    def __init__(self, source: IO[bytes], sink_fd: int):
        super().__init__(name="fleetprof-run-stderr", daemon=True)
        self.source = source
        self.sink_fd = sink_fd
        self.oom_seen = False

    def run(self) -> None:
        tail = b""
        fd = self.source.fileno()
        while True:
            try:
                chunk = os.read(fd, 65536)
            except OSError:
                break
            if not chunk:
                break
            view = memoryview(chunk)
            while view:
                try:
                    view = view[os.write(self.sink_fd, view):]
                except OSError:
                    break  # our stderr is gone; keep draining so the child never blocks on a full pipe
            if not self.oom_seen and OOM_RE.search(tail + chunk):
                self.oom_seen = True
            tail = chunk[-_OOM_OVERLAP:]


class JobRunner:
    def __init__(self, settings: AgentSettings, *, transport: Client | None = None,
                 environ: dict[str, str] | None = None, stderr_fd: int = 2,
                 child_env: Callable[..., dict[str, str]] | None = None):
        self.settings = settings
        self.transport = transport
        if transport is None and settings.server_url:
            self.transport = Client(settings.server_url, settings.token, timeout_s=min(5.0, settings.http_timeout_s))
        # The child's environment starts as ours: process plumbing, not settings.
        self.environ = dict(os.environ if environ is None else environ)
        self.stderr_fd = stderr_fd
        self._child_env = child_env if child_env is not None else _hooks_child_env()
        self._warned = False

    def _post(self, payload: dict[str, Any]) -> bool:
        if self.transport is None:
            if not self._warned:
                self._warned = True
                log.warning("no server (FLEETPROF_SERVER_URL); the job is not registered")
            return False
        try:
            self.transport.register_job({k: v for k, v in payload.items() if v is not None})
            return True
        except ApiError as exc:
            if not self._warned:
                self._warned = True
                log.warning("cannot reach the server, the job runs unregistered: %s", exc)
            else:
                log.warning("could not update the job: %s", exc)
            return False

    def child_environment(self, job_id: str, hooks: bool, traces: HookTraces | None = None) -> dict[str, str]:
        env = dict(self.environ)
        level = self.settings.hooks_level if hooks else "off"
        if self._child_env is not None:
            extra: dict[str, int] = {}
            if traces is not None and hooks:
                extra = {"alloc_trace_steps": traces.alloc_trace_steps, "profile_steps": traces.profile_steps}
            env.update(self._child_env(job_id=job_id, server_url=self.settings.server_url,
                                       token=self.settings.token, level=level, **extra))
        else:
            if hooks:
                log.warning("the framework hooks are not installed (agent.hooks.child_env missing): "
                            "the job runs without step/layer profiling")
            env["FLEETPROF_JOB_ID"] = job_id
            env["FLEETPROF_HOOKS_LEVEL"] = "off"
        return env

    def run(self, command: Sequence[str], *, job_id: str, team: str | None = None, name: str | None = None,
            hooks: bool = True, batch_size: int | None = None, traces: HookTraces | None = None,
            extra_env: Mapping[str, str] | None = None, applied: Sequence[Mapping[str, Any]] | None = None,
            ) -> JobOutcome:
        """`extra_env`: set in the child's environment over ours (`--apply`); `applied`: the recommendations that
        were applied, recorded in the job's metadata (`applied`) for the compare view."""
        metadata: dict[str, Any] = {}
        if batch_size is not None:
            metadata["batch_size_source"] = "flag"
        if applied:
            metadata["applied"] = [dict(a) for a in applied]
        cuda = self.environ.get("CUDA_VISIBLE_DEVICES")
        job: dict[str, Any] = {
            "job_id": job_id, "team": team, "name": name or os.path.basename(command[0]),
            "command": shlex.join(command), "host": socket.gethostname(), "user": _user(),
            "state": "running", "started_at": time.time(), "gpu_uuids": gpus_from_cuda_visible_devices(cuda),
            "cuda_visible_devices": cuda,
            # The framework is the hooks' word (their job_start: "pytorch 2.x", "keras 3.x (jax backend)", "jax
            # 0.x"); a program that imports none of them has none (unknown, not "pytorch").
            "framework": None,
            # --batch-size: the job's own word, which the hooks' reading does not replace (server.jobs.framework_info)
            "batch_size": batch_size, "metadata": metadata or None,
        }
        self._post(job)
        env = self.child_environment(job_id, hooks, traces)
        env.update(extra_env or {})
        result = self._spawn(command, env)
        self._post({**job, "state": result.state, "ended_at": time.time(), "exit_code": result.exit_code})
        if self.transport is not None:
            self.transport.close()
        return result

    def _spawn(self, command: Sequence[str], env: dict[str, str]) -> JobOutcome:
        try:
            child = subprocess.Popen(list(command), env=env, stderr=subprocess.PIPE, process_group=0)
        except FileNotFoundError:
            log.error("command not found: %s", command[0])
            return JobOutcome(127, "failed", False)
        except PermissionError:
            log.error("permission denied: %s", command[0])
            return JobOutcome(126, "failed", False)
        assert child.stderr is not None
        tee = _StderrTee(child.stderr, self.stderr_fd)
        tee.start()

        def forward(signum: int, _frame: object) -> None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(child.pid, signum)

        previous = {}
        in_main = threading.current_thread() is threading.main_thread()
        if in_main:
            for sig in FORWARDED_SIGNALS:
                previous[sig] = signal.signal(sig, forward)
        try:
            returncode = child.wait()
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        # a grandchild that inherited the pipe may keep it open: don't wait for it forever
        tee.join(timeout=2.0)
        child.stderr.close()
        return outcome(returncode, tee.oom_seen)


def _user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return str(os.getuid())


def _hooks_child_env() -> Callable[..., dict[str, str]] | None:
    try:
        from agent.hooks import child_env
    except ImportError:
        return None
    return child_env


def default_job_id(settings: AgentSettings | None = None) -> str:
    """Inside a Slurm allocation `slurm:$SLURM_JOB_ID`, the id the agent and the Slurm prolog give the job; else
    a generated one (generate_job_id)."""
    if settings is not None and settings.slurm_job_id and (job_id := slurm_job_id(settings.slurm_job_id)):
        return job_id
    return generate_job_id(_user())
