"""Issue #18 acceptance: an unmodified CPU training script run twice under `fleetprof run --name N` at two batch
sizes gets its batch sizes recorded, and `GET /api/v1/rightsizing?name=N` recommends a batch size with the fit as
its evidence.

On a CPU-only run the memory signal is the one the report has for it: the hooks' per-step peak process RSS
(`memory.peak_reserved_bytes`, source "cpu_rss"), measured against the host's physical memory (`framework.
device_memory_total_bytes`, source "host_memory").
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import httpx

from tests.e2e.conftest import FLEETPROF, client_env

SCRIPT = Path(__file__).parents[1] / "hooks" / "scripts" / "train_loader.py"


def _get(url: str, token: str, path: str, **params: str) -> dict:
    r = httpx.get(f"{url}{path}", params=params, headers={"Authorization": f"Bearer {token}"}, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()


def _run(env: dict[str, str], job_id: str, *args: str, flags: tuple[str, ...] = ()) -> None:
    proc = subprocess.run([*FLEETPROF, "run", "--job-id", job_id, "--name", "e2e-batch", *flags, "--", sys.executable,
                           str(SCRIPT), *args], env=env, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr
    assert f"BATCH {args[0]}" in proc.stdout


def test_two_runs_at_two_batch_sizes_give_a_batch_size_fit(live_server: str, cli_env, make_token) -> None:
    token = make_token("team", team="e2e-batch")
    env = client_env(cli_env, live_server, token)
    batches = {"e2e-batch-small": 8, "e2e-batch-large": 48}
    for job_id, batch in batches.items():
        _run(env, job_id, str(batch), "5")

    for job_id, batch in batches.items():
        job = _get(live_server, token, f"/api/v1/jobs/{job_id}")
        assert job["batch_size"] == batch  # recorded from inside the script: no fleetprof code in it
        report = _get(live_server, token, f"/api/v1/jobs/{job_id}/report")
        fw = report["framework"]
        assert report["batch_size"] == batch and fw["batch_size_observed"] == batch
        assert fw["batch_size_source"] == "hooks:dataloader"
        assert fw["model_class"] == "__main__.ConvNet" and fw["optimizers"] == ["Adam"]
        assert fw["device_memory_source"] == "host_memory" and fw["device_memory_total_bytes"] > 0
        assert report["sources"]["memory.peak_reserved_bytes"] == "cpu_rss"
        assert report["time"]["samples_per_s"] > 0

    advice = _get(live_server, token, "/api/v1/rightsizing", name="e2e-batch", team="e2e-batch")
    assert set(advice["history_job_ids"]) == set(batches)
    rec = next(r for r in advice["recommendations"] if r["kind"] == "batch_size")
    ev = rec["evidence"]
    assert ev["method"] == "fit" and ev["runs"] == 2 and ev["batch_size"] == 48
    assert sorted(p["batch_size"] for p in ev["points"]) == [8, 48]
    assert ev["memory_signal"] == ["peak_reserved_bytes (cpu_rss)"]
    assert ev["capacity_source"] == "hooks:host_memory"
    # the fit goes through both measured points (two points: exactly)
    for p in ev["points"]:
        assert abs(ev["fixed_bytes"] + ev["per_sample_bytes"] * p["batch_size"] - p["memory_bytes"]) < 1024
    assert ev["per_sample_bytes"] > 0 and ev["max_batch_size"] is not None
    assert rec["reason"] and ("fits" in rec["summary"] or "at most" in rec["summary"])


def test_batch_size_flag_overrides_what_the_hooks_read(live_server: str, cli_env, make_token) -> None:
    token = make_token("team", team="e2e-batch-flag")
    env = client_env(cli_env, live_server, token)
    _run(env, "e2e-batch-flag", "6", "3", flags=("--batch-size", "64"))
    job = _get(live_server, token, "/api/v1/jobs/e2e-batch-flag")
    assert job["batch_size"] == 64
    fw = _get(live_server, token, "/api/v1/jobs/e2e-batch-flag/report")["framework"]
    assert fw["batch_size_source"] == "flag" and fw["batch_size_observed"] == 6


def test_profile_flag_uploads_an_analyzed_trace(live_server: str, cli_env, make_token) -> None:
    token = make_token("team", team="e2e-profile")
    env = client_env(cli_env, live_server, token)
    _run(env, "e2e-profile", "8", "5", flags=("--profile", "2"))
    report = _get(live_server, token, "/api/v1/jobs/e2e-profile/report")
    assert report["traces"]["kineto_files"] == 1, report["traces"]
    # analyzed, not only stored: the two profiled steps were found at their ProfilerStep marks (a CPU-only trace
    # has no GPU time, so the GPU breakdown is unknown: null)
    (rank0,) = report["traces"]["kineto"]["per_rank"]
    assert rank0["steps"] == 2 and rank0["step_time_mean_us"] > 0
    assert report["time"]["breakdown"]["compute_pct"] is None
