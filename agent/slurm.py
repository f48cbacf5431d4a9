"""Slurm prolog and epilog: register the job where Slurm starts it, end it where Slurm ends it, and summarize it.

`fleetprof slurm prolog|epilog` (agent/cli/slurm.py) runs this from the thin wrappers in deploy/slurm/, which slurmd
runs as root on every node of an allocation. What Slurm gives them (its Prolog and Epilog guide, Slurm 23.02):

- both: SLURM_JOB_ID (an array task's own id), SLURM_JOB_USER, SLURM_JOB_UID, SLURM_JOB_ACCOUNT,
  SLURM_JOB_PARTITION, SLURMD_NODENAME, SLURM_JOB_GPUS and CUDA_VISIBLE_DEVICES (the node's device numbers, e.g.
  "0,1": the prolog runs outside the job's cgroup, so not the job's own "0,1"), SLURM_JOB_STDOUT, and
  SLURM_SCRIPT_CONTEXT (prolog_slurmd / epilog_slurmd);
- the epilog only: SLURM_JOB_EXIT_CODE (the batch script's wait(2) status), SLURM_JOB_EXIT_CODE2 (the same as
  "<exit>:<signal>") and SLURM_JOB_DERIVED_EC (the highest exit status of the job's steps).

Not given to node prologs and epilogs: the job's name, node list and array ids, so the job id is `slurm:<SLURM_JOB_ID>`
exactly as the agent derives it from a process's environment (agent.attribution.slurm_job_id). The state follows
the batch script, as Slurm's own does: a signal -> killed (exit status 128+N, like a shell and `fleetprof run`), a
non-zero exit -> failed, else finished; a failed step under a script that exits 0 is kept in the metadata
(`slurm_derived_exit_code`), not in the state. GPU indices are taken as NVML indices (the node's device numbers
equal them unless CUDA_DEVICE_ORDER or gres.conf reorders them; an assumption, see deploy/slurm/README.md).
"""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from agent.attribution import slurm_job_id
from fleetprof import units


class SlurmEnvError(ValueError):
    """The environment is not a Slurm prolog's or epilog's (no usable SLURM_JOB_ID)."""


@dataclass(frozen=True)
class ExitState:
    state: str  # finished | failed | killed | lost (no exit status given: how it ended is unknown)
    exit_code: int | None  # like a shell: the exit status, or 128 + signal
    slurm_exit: str | None  # "<exit>:<signal>" as Slurm shows it


@dataclass(frozen=True)
class SlurmJob:
    slurm_id: str
    job_id: str
    user: str | None
    uid: int | None
    account: str | None
    partition: str | None
    slurm_node: str | None
    gpus: tuple[str, ...]  # as Slurm lists them: device numbers (or UUIDs where CUDA_VISIBLE_DEVICES holds them)
    exit: ExitState | None  # epilog only
    derived_exit: str | None  # "<exit>:<signal>" of the worst step; epilog only

    @classmethod
    def from_environ(cls, env: Mapping[str, str], *, epilog: bool) -> SlurmJob:
        slurm_id = env.get("SLURM_JOB_ID") or env.get("SLURM_JOBID") or ""
        job_id = slurm_job_id(slurm_id)
        if job_id is None:
            raise SlurmEnvError(f"SLURM_JOB_ID {slurm_id!r} is not a Slurm job id (not run by slurmd?)")
        gpus = env.get("SLURM_JOB_GPUS") or env.get("CUDA_VISIBLE_DEVICES") or env.get("SLURM_STEP_GPUS") or ""
        listed = [g.strip() for g in gpus.split(",")]
        raw_derived = _int(env.get("SLURM_JOB_DERIVED_EC"))
        return cls(
            slurm_id=slurm_id.strip(), job_id=job_id, user=env.get("SLURM_JOB_USER") or None,
            uid=_int(env.get("SLURM_JOB_UID")), account=env.get("SLURM_JOB_ACCOUNT") or None,
            partition=env.get("SLURM_JOB_PARTITION") or None, slurm_node=env.get("SLURMD_NODENAME") or None,
            gpus=tuple(g for g in listed if g and g.lower() not in ("none", "nodevfiles")),  # older Slurm: no GPUs
            exit=exit_state(env.get("SLURM_JOB_EXIT_CODE2"), env.get("SLURM_JOB_EXIT_CODE")) if epilog else None,
            derived_exit=None if raw_derived is None else _exit_signal_text(*_split_wait_status(raw_derived)),
        )


def _int(value: str | None) -> int | None:
    try:
        return int(value.strip()) if value is not None else None
    except ValueError:
        return None


def _split_wait_status(status: int) -> tuple[int, int]:
    """(exit code, signal) of a wait(2) status."""
    signal = status & 0x7F
    return ((status >> 8) & 0xFF, 0) if signal == 0 else (0, signal)


def _exit_signal_text(code: int, signal: int) -> str:
    return f"{code}:{signal}"


def exit_state(exit_code2: str | None, exit_code: str | None) -> ExitState:
    """The job's end from SLURM_JOB_EXIT_CODE2 ("<exit>:<signal>"), else the raw wait status SLURM_JOB_EXIT_CODE."""
    code = signal = None
    if exit_code2 and ":" in exit_code2:
        code, signal = (_int(part) for part in exit_code2.split(":", 1))
    if (code is None or signal is None) and (raw := _int(exit_code)) is not None:
        code, signal = _split_wait_status(raw)
    if code is None or signal is None:
        return ExitState("lost", None, None)
    text = _exit_signal_text(code, signal)
    if signal:
        return ExitState("killed", 128 + signal, text)
    return ExitState("failed" if code else "finished", code, text)


def resolve_gpu_uuids(slurm_gpus: tuple[str, ...], index_to_uuid: Mapping[int, str]) -> list[str] | None:
    """The UUIDs of the GPUs Slurm lists (device numbers taken as NVML indices; UUIDs kept); None when any is
    unknown: a wrong GPU would claim another job's telemetry, where none leaves it to the agent's attribution."""
    uuids = []
    for gpu in slurm_gpus:
        if gpu.startswith(("GPU-", "MIG-")):
            uuids.append(gpu)
        elif gpu.isdigit() and int(gpu) in index_to_uuid:
            uuids.append(index_to_uuid[int(gpu)])
        else:
            return None
    return uuids or None


def registration(job: SlurmJob, *, node: str, gpu_uuids: list[str] | None, now: float) -> dict[str, Any]:
    """The prolog's POST /api/v1/jobs: running since now, on `node`, owned by the job's Slurm account."""
    metadata = {"scheduler": "slurm", "slurm_job_id": job.slurm_id, "slurm_partition": job.partition,
                "slurm_account": job.account, "slurm_node": job.slurm_node, "slurm_gpus": ",".join(job.gpus) or None}
    payload = {"job_id": job.job_id, "team": job.account, "user": job.user, "host": node, "node": node,
               "state": "running", "started_at": now, "gpu_uuids": gpu_uuids,
               "gpus_requested": len(job.gpus) if job.gpus else None,
               "metadata": {k: v for k, v in metadata.items() if v is not None}}
    return {k: v for k, v in payload.items() if v is not None}


def end_update(job: SlurmJob, *, now: float) -> dict[str, Any]:
    """The epilog's POST /api/v1/jobs: its end as Slurm reports it (no team: the prolog set it, and an agent token
    may not move a job to another team)."""
    assert job.exit is not None
    metadata = {"slurm_exit_code2": job.exit.slurm_exit, "slurm_derived_exit_code": job.derived_exit}
    payload = {"job_id": job.job_id, "state": job.exit.state, "ended_at": now, "exit_code": job.exit.exit_code,
               "metadata": {k: v for k, v in metadata.items() if v is not None}}
    return {k: v for k, v in payload.items() if v is not None}


def job_link(job_id: str, *, server_url: str, dashboard_url: str | None) -> str:
    """The job's page on the dashboard, else its HTML report on the API (which asks for a token)."""
    quoted = quote(job_id, safe="")
    if dashboard_url:
        return f"{dashboard_url.rstrip('/')}/jobs/{quoted}"
    return f"{server_url.rstrip('/')}/api/v1/jobs/{quoted}/report?format=html"


def _state_text(job: SlurmJob) -> str:
    if job.exit is None or job.exit.slurm_exit is None:
        return "unknown (Slurm gave the epilog no exit status)"
    code, signal = job.exit.slurm_exit.split(":")
    how = f"signal {signal}" if signal != "0" else f"exit code {code}"
    derived = f"; worst step {job.derived_exit}" if job.derived_exit not in (None, "0:0") else ""
    return f"{job.exit.state} ({how}, Slurm ExitCode {job.exit.slurm_exit}{derived})"


def _gpu_hours(value: float | None) -> str:
    if value is None:
        return units.UNKNOWN
    return f"{value:,.2f} GPU-h" if value >= 1 else f"{value:.3g} GPU-h"  # a short test job is not "0.00"


def summary_lines(job: SlurmJob, report: Mapping[str, Any] | None, *, link: str,
                  unavailable: str | None = None) -> list[str]:
    """A seff-style summary of the job from its report: wall time, GPU-hours, peak device memory against the
    GPU's capacity, mean utilization, energy, and where the full report is. Unknown figures read "unknown"."""
    lines = [f"fleetprof summary of Slurm job {job.slurm_id} ({job.job_id})",
             f"  State:               {_state_text(job)}"]
    if report is None:
        return [*lines, f"  Figures:             unavailable ({unavailable or 'no report'})",
                f"  Report:              {link}"]
    gpus = [g for g in report.get("gpus") or [] if isinstance(g, dict)]
    duration = report.get("duration_s")
    memory = report.get("memory") or {}
    energy = report.get("energy") or {}
    peak = memory.get("peak_used_bytes")
    # The job's peak is its largest single-GPU peak: measured against that GPU's capacity.
    capacity = next((g.get("memory_total_bytes") for g in gpus
                     if peak is not None and g.get("peak_used_bytes") == peak), None)
    share = f" ({100.0 * peak / capacity:.1f} %)" if peak is not None and capacity else ""
    names = sorted({str(g.get("name")) for g in gpus if g.get("name")})
    gpu_hours = duration * len(gpus) / 3600.0 if duration is not None and gpus else None
    energy_j = energy.get("energy_j")
    lines += [
        f"  GPUs:                {len(gpus) or 'none seen'}" + (f" x {', '.join(names)}" if names else ""),
        f"  Wall time:           {units.seconds(duration)}",
        f"  GPU-hours:           {_gpu_hours(gpu_hours)} (GPUs x wall time)",
        f"  Peak GPU memory:     {units.size(peak)} of {units.size(capacity)}{share} (NVML, largest one GPU)",
        f"  Mean GPU util:       {units.pct((report.get('utilization') or {}).get('gpu_mean_pct'))}",
        f"  Energy:              {units.energy(energy_j)}"
        + (f" ({units.energy_source(energy.get('source'))})" if energy_j is not None else ""),
        f"  Report:              {link}",
    ]
    # The epilog runs seconds after the end: the agent's last batch may still be on its way (the final report,
    # computed once the late-data window closed, has it).
    return [*lines, "  (figures as of the job's end; the report linked above is final a few minutes later)"]


def append_to_job_output(path: str, text: str, *, uid: int | None) -> None:
    """Append `text` to the job's output file, which the user owns and root is writing to: only an existing
    regular file owned by the job's user, never through a symlink (the user could point one at any root file)."""
    if uid is None:
        raise PermissionError("no SLURM_JOB_UID: the owner of the job's output cannot be checked")
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW | os.O_NOCTTY | os.O_NONBLOCK)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != uid:
            raise PermissionError(f"{path} is not a regular file of uid {uid}")
        os.write(fd, text.encode())
    finally:
        os.close(fd)
