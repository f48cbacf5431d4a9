"""The one-screen summary `fleetprof run` ends with: how the job ended and what its report says, with units.

Printed on stderr (the job's stdout stays the job's), from the job's report read right after the end: what the
hooks and agents had sent by then. Figures the report does not have read "unknown" (null in `--format json`). No
summary at all when the server cannot be reached: the job has run, which is what matters.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from agent.run import JobOutcome
from agent.slurm import job_link
from fleetprof import units
from fleetprof.client import ApiError, Client


@dataclass(frozen=True)
class RunSummary:
    job_id: str
    state: str  # as `fleetprof run` saw the command end: finished | failed | killed | oom
    exit_code: int
    duration_s: float | None  # the report's (registration to end)
    steps: int | None  # framework steps the hooks reported
    step_time_mean_s: float | None
    peak_used_bytes: float | None  # NVML, largest single GPU
    peak_allocated_bytes: float | None  # framework allocator
    energy_j: float | None
    energy_source: str | None  # hardware_counter | integrated_power | ...
    report_url: str

    def as_json(self) -> dict[str, Any]:
        return asdict(self)


def _get(report: Mapping[str, Any], section: str, *keys: str) -> Any:
    value: Any = report.get(section)
    for key in keys:
        value = value.get(key) if isinstance(value, Mapping) else None
    return value


def summarize(job_id: str, outcome: JobOutcome, report: Mapping[str, Any], *, report_url: str) -> RunSummary:
    return RunSummary(
        job_id=job_id, state=outcome.state, exit_code=outcome.exit_code, duration_s=report.get("duration_s"),
        steps=_get(report, "time", "steps"), step_time_mean_s=_get(report, "time", "step_time_s", "mean"),
        peak_used_bytes=_get(report, "memory", "peak_used_bytes"),
        peak_allocated_bytes=_get(report, "memory", "peak_allocated_bytes"),
        energy_j=_get(report, "energy", "energy_j"), energy_source=_get(report, "energy", "source"),
        report_url=report_url,
    )


def summary_text(s: RunSummary) -> str:
    energy = units.energy(s.energy_j) + (f" ({units.energy_source(s.energy_source)})" if s.energy_j is not None
                                         else "")
    lines = [
        f"fleetprof run: job {s.job_id}",
        f"  state            {s.state} (exit code {s.exit_code})",
        f"  duration         {units.seconds(s.duration_s)}",
        f"  steps            {units.count(s.steps)}",
        f"  mean step time   {units.seconds(s.step_time_mean_s)} (framework hooks)",
        f"  peak GPU memory  {units.size(s.peak_used_bytes)} (NVML, largest one GPU)",
        f"  peak allocated   {units.size(s.peak_allocated_bytes)} (framework allocator)",
        f"  energy           {energy}",
        f"  report           {s.report_url}",
    ]
    return "\n".join(lines) + "\n"


def fetch_summary(transport: Client, job_id: str, outcome: JobOutcome, *, dashboard_url: str | None
                  ) -> RunSummary | None:
    """The summary from the job's report as the server has it now; None when the server cannot answer."""
    try:
        report = transport.report_json(job_id)
    except ApiError:
        return None
    if not isinstance(report, Mapping):
        return None
    url = job_link(job_id, server_url=transport.server_url, dashboard_url=dashboard_url)
    return summarize(job_id, outcome, report, report_url=url)
