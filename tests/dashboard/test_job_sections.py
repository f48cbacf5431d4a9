"""Pieces of the job page built from a typed report (dashboard/pages/job.py), without a browser."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dashboard import data
from dashboard.client import ApiError
from dashboard.pages.job import (
    energy_card,
    gpus_section,
    layers_section,
    processes_section,
    recommendations_section,
    saving_line,
    sources_section,
    summary_section,
)
from fleetprof.api_models import JobRead
from fleetprof.report import FrameworkSection, JobReport, MemorySection, ProcessMemory

GOLDEN = Path(__file__).resolve().parents[1] / "analysis" / "golden" / "characterize_real_job.json"


@pytest.fixture(scope="module")
def report() -> JobReport:
    # a real report (the analyzers' golden output, Kineto trace merged), read as the page reads the API's answer
    return data.job_report(json.loads(GOLDEN.read_text())["traced"])


def _job(**fields: object) -> JobRead:
    base: dict[str, object] = {
        "job_id": "j", "team": None, "name": None, "command": None, "framework": None, "host": None, "user": None,
        "node": None, "state": "finished", "batch_size": None, "gpu_type_requested": None, "gpus_requested": None,
        "exit_code": None, "created_at": 1.7e9, "updated_at": 1.7e9, "started_at": None, "ended_at": None,
        "duration_s": None, "gpu_uuids": [], "metadata": {}}
    return JobRead.model_validate({**base, **fields})


def _text(component: object) -> str:
    return str(component.to_plotly_json())  # type: ignore[attr-defined]


def test_a_negative_saving_reads_as_the_extra_cost_it_is() -> None:
    assert saving_line({"usd_per_gpu_hour": -1.52, "usd": -291.84}) == "extra cost: $1.52 per GPU-hour, $291.84"
    assert saving_line({"usd_per_gpu_hour": 0.75, "usd": None}) == "saving: $0.75 per GPU-hour, unknown"
    assert saving_line({"usd_per_gpu_hour": -0.5, "usd": None}) == "extra cost: $0.50 per GPU-hour, unknown"
    assert saving_line({"energy_fraction": 0.12}).startswith("saving: ")
    assert saving_line(None) is None


def test_processes_section_lists_the_jobs_processes_and_co_tenants(report: JobReport) -> None:
    def proc(pid: int, whose: str, job_id: str | None, attribution: str | None, peak: int) -> ProcessMemory:
        return ProcessMemory.model_validate({"pid": pid, "gpu_uuid": "GPU-0", "peak_used_bytes": peak, "job_id": job_id,
                                             "whose": whose, "attribution": attribution, "first_seen": 1.7e9,
                                             "last_seen": 1.7e9 + 60})

    memory = report.memory.model_copy(update={
        "process_peak_bytes": 31 * 2**30, "other_processes": 2, "other_processes_peak_bytes": 2 * 2**30,
        "processes": [proc(4100, "this job", "j", "env:FLEETPROF_JOB_ID", 31 * 2**30),
                      proc(777, "unattributed", None, None, 2**30),
                      proc(778, "another job", None, "env:SLURM_JOB_ID", 2**30)]})
    text = _text(processes_section(report.model_copy(update={"memory": memory})))
    assert "31.00 GiB" in text and "this job" in text and "unattributed" in text and "env:FLEETPROF_JOB_ID" in text
    assert "another job" in text and "2.00 GiB" in text
    bare = MemorySection.model_validate({**report.memory.model_dump(), "processes": [], "process_peak_bytes": None,
                                         "other_processes": None, "other_processes_peak_bytes": None})
    empty = _text(processes_section(report.model_copy(update={"memory": bare})))
    assert "no per-process rows" in empty and "unknown" in empty


def test_a_job_the_server_ended_says_why() -> None:
    reason = "no process of this job seen on its GPUs since 2026-11-25 10:00:00 UTC (timeout 900 s)"
    lost = str([p.to_plotly_json() for p in summary_section(_job(state="lost", end_reason=reason), None)])
    assert "job-end-reason" in lost and reason in lost
    assert "job-end-reason" not in str([p.to_plotly_json() for p in summary_section(_job(), None)])


def test_the_report_sections_show_the_reports_figures(report: JobReport) -> None:
    page = " ".join(_text(part) for part in (*summary_section(_job(name="real"), report), energy_card(report),
                                             recommendations_section(report), layers_section(report),
                                             gpus_section(report), sources_section(report)))
    assert report.gpus and all(g.uuid in page for g in report.gpus)
    assert f"{report.memory.peak_used_bytes / 2**30:.2f} GiB" in page
    assert all(r.summary in page for r in report.recommendations)
    assert all(key in page for key in report.sources.model_dump(by_alias=True, exclude_unset=True))


def test_an_answer_that_is_no_report_is_an_error_not_a_crash(report: JobReport) -> None:
    doc = report.model_dump(mode="json", exclude_unset=True)
    del doc["memory"]["peak_used_bytes"]
    with pytest.raises(ApiError, match=r"memory\.peak_used_bytes") as info:
        data.job_report(doc)
    assert info.value.status == data.UNEXPECTED_ANSWER
    with pytest.raises(ApiError, match="job list"):
        data.job_list({"items": [{"job_id": "j"}], "total": 1, "limit": 50, "offset": 0})


def test_framework_section_shows_what_the_hooks_read(report: JobReport) -> None:
    from dashboard.pages.job import framework_section

    typed = report.model_copy(update={"batch_size": 64, "framework": FrameworkSection(
        batch_size_observed=48, batch_size_observed_source="dataloader", batch_size_source="flag",
        model_class="__main__.ConvNet", parameter_count=7002, optimizers=["Adam"], precision="bfloat16",
        precision_source="autocast", device="cpu", device_memory_total_bytes=16 * 2**30,
        device_memory_source="host_memory")})
    text = str(framework_section(typed).to_plotly_json())  # type: ignore[union-attr]
    assert "64 (flag; hooks read 48 from dataloader)" in text and "__main__.ConvNet" in text
    assert "bfloat16 (autocast)" in text and "16.00 GiB (host_memory)" in text and "Adam" in text
    assert framework_section(report.model_copy(update={"framework": None})) is None


def test_health_card_lists_findings_and_nvml_stragglers_or_says_unknown(report: JobReport) -> None:
    from dashboard.pages.job import health_section, kpis
    from fleetprof.report import HealthFinding, HealthSection, Straggler, Stragglers

    finding = HealthFinding(gpu_uuid="GPU-2", kind="thermal", seconds=600.0, fraction=0.4, severity="warning",
                            summary="thermal slowdown: SM clock -29 % (1400 vs 1980 MHz) for 10.0 min")
    slow = Straggler.model_validate({"rank": None, "gpu_uuid": "GPU-2", "median_step_s": 10.5,
                                     "slowdown_fraction": 0.31, "busy_phase_s": 10.4, "peer_busy_phase_s": 8.0,
                                     "likely_cause": "thermal throttling"})
    time = report.time.model_copy(update={"stragglers": Stragglers(ranks=None, median_step_s=10.5, stragglers=[slow],
                                                                   gpus=4, source="nvml")})
    text = _text(health_section(report.model_copy(update={
        "health": HealthSection(findings=[finding], gpus_checked=4, gpus_with_findings=1), "time": time})))
    assert "SM clock -29 %" in text and "10.0 min" in text and "40.0 %" in text
    assert "thermal throttling" in text and "31.0 %" in text
    old = _text(health_section(report.model_copy(update={"health": None})))
    assert "unknown" in old and "no straggling GPU" in old
    assert "job-mfu" in _text(kpis(report)) and "unknown" in _text(kpis(report.model_copy(update={"mfu": None})))


def test_fleet_goodput_and_attention_rows() -> None:
    from dashboard.pages.fleet import attention_rows, goodput_rows
    from fleetprof.api_models import FleetSummary

    base = {"window_s": 86400.0, "generated_at": 1.7e9, "gpus": 2, "gpus_total": 2, "gpu_hours": 48.0,
            "busy_gpu_hours": 30.0, "busy_fraction": 0.625, "util_weighted_gpu_hours": 20.0, "idle_gpus_now": 0,
            "gpus_unknown_now": 0, "energy_j": None, "memory_stranded_bytes": None, "most_wasteful_jobs": [],
            "sources": {}}
    parts = {"allocated_gpu_hours": 10.0, "idle_gpu_hours": 1.0, "input_stalled_gpu_hours": 2.0,
             "throttled_gpu_hours": 0.5, "productive_gpu_hours": 6.5, "unknown_gpu_hours": 0.0,
             "productive_fraction": 0.65}
    s = FleetSummary.model_validate({**base, "goodput": parts, "goodput_by_team": [{"team": None, **parts}],
                                     "gpus_needing_attention": [{
                                         "node": "n1", "gpu_uuid": "GPU-2", "gpu_index": 2, "gpu_name": "H100",
                                         "severity": "critical", "findings": [{
                                             "gpu_uuid": "GPU-2", "kind": "xid", "seconds": None, "fraction": None,
                                             "summary": "XID 79 reported", "severity": "critical"}]}]})
    rows = goodput_rows(s)
    assert [r[0] for r in rows] == ["fleet", "(no team)"]
    assert rows[0][1:] == ["10.0 GPU-h", "1.0 GPU-h", "2.0 GPU-h", "0.5 GPU-h", "6.5 GPU-h", "0.0 GPU-h", "65.0 %"]
    (row,) = attention_rows(s)
    assert row[1] == "2" and row[3] == "critical" and "XID 79" in _text(row[4])
    assert goodput_rows(FleetSummary.model_validate(base)) == []  # an older collector: nothing, not zeros
