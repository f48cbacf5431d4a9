"""Pieces of the job page built from a report (dashboard/pages/job.py), without a browser."""

from __future__ import annotations

from dashboard.pages.job import saving_line


def test_a_negative_saving_reads_as_the_extra_cost_it_is() -> None:
    assert saving_line({"usd_per_gpu_hour": -1.52, "usd": -291.84}) == "extra cost: $1.52 per GPU-hour, $291.84"
    assert saving_line({"usd_per_gpu_hour": 0.75, "usd": None}) == "saving: $0.75 per GPU-hour, unknown"
    assert saving_line({"usd_per_gpu_hour": -0.5, "usd": None}) == "extra cost: $0.50 per GPU-hour, unknown"
    assert saving_line({"energy_fraction": 0.12}).startswith("saving: ")
    assert saving_line(None) is None


def test_processes_section_lists_the_jobs_processes_and_co_tenants() -> None:
    from dashboard.pages.job import processes_section

    report = {"job_id": "j", "memory": {"process_peak_bytes": 31 * 2**30, "other_processes": 1, "other_processes_peak_bytes": 2**30,
                         "processes": [{"pid": 4100, "gpu_uuid": "GPU-0", "job_id": "j",
                                        "attribution": "env:FLEETPROF_JOB_ID", "peak_used_bytes": 31 * 2**30,
                                        "first_seen": 1.7e9, "last_seen": 1.7e9 + 60},
                                       {"pid": 777, "gpu_uuid": "GPU-0", "job_id": None, "attribution": None,
                                        "peak_used_bytes": 2**30, "first_seen": 1.7e9, "last_seen": 1.7e9 + 5},
                                       {"pid": 778, "gpu_uuid": "GPU-0", "job_id": None, "whose": "another job",
                                        "attribution": "env:SLURM_JOB_ID", "peak_used_bytes": 2**30,
                                        "first_seen": 1.7e9, "last_seen": 1.7e9 + 5}]}}
    text = str(processes_section(report).to_plotly_json())
    assert "31.00 GiB" in text and "this job" in text and "unattributed" in text and "env:FLEETPROF_JOB_ID" in text
    assert "another job" in text
    empty = str(processes_section({"memory": {}}).to_plotly_json())
    assert "no per-process rows" in empty and "unknown" in empty


def test_a_job_the_server_ended_says_why() -> None:
    from dashboard.pages.job import summary_section

    reason = "no process of this job seen on its GPUs since 2026-11-25 10:00:00 UTC (timeout 900 s)"
    lost = str([p.to_plotly_json() for p in summary_section({"state": "lost", "end_reason": reason}, {})])
    assert "job-end-reason" in lost and reason in lost
    assert "job-end-reason" not in str([p.to_plotly_json() for p in summary_section({"state": "finished"}, {})])


def test_framework_section_shows_what_the_hooks_read() -> None:
    from dashboard.pages.job import framework_section

    report = {"batch_size": 64, "framework": {
        "batch_size_observed": 48, "batch_size_observed_source": "dataloader", "batch_size_source": "flag",
        "model_class": "__main__.ConvNet", "parameter_count": 7002, "optimizers": ["Adam"], "precision": "bfloat16",
        "precision_source": "autocast", "device": "cpu", "device_memory_total_bytes": 16 * 2**30,
        "device_memory_source": "host_memory"}}
    text = str(framework_section(report).to_plotly_json())  # type: ignore[union-attr]
    assert "64 (flag; hooks read 48 from dataloader)" in text and "__main__.ConvNet" in text
    assert "bfloat16 (autocast)" in text and "16.00 GiB (host_memory)" in text and "Adam" in text
    assert framework_section({"framework": None}) is None
