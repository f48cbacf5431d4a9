"""GET /api/v1/jobs/{job_id}/projection on jobs made by importing real Kineto traces (HTA's A100-vs-V100 pair,
tests/data/kineto/hta/trace_diff) through the traces import path, on the real app and Postgres."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from server.analysis.traces.kineto import summarize_trace
from tests.server.helpers import auth

PAIR = Path(__file__).resolve().parents[1] / "data/kineto/hta/trace_diff"
A100, V100 = PAIR / "control/control.json.gz", PAIR / "test/test.json.gz"


def _import(api, token, job, path: Path) -> None:  # type: ignore[no-untyped-def]
    r = api.post(f"/api/v1/jobs/{job}/traces", content=path.read_bytes(), params={"filename": path.name},
                 headers={**auth(token), "Content-Type": "application/gzip"})
    assert r.status_code == 200, r.text


def test_imported_trace_job_projects_onto_the_other_gpu_with_a_band(api, make_token):
    team = make_token("team", team="recsys")
    _import(api, team, "dlrm-a100", A100)
    r = api.get("/api/v1/jobs/dlrm-a100/projection", params={"gpu": "V100-16GB"}, headers=auth(team))
    assert r.status_code == 200, r.text
    p = r.json()
    assert p["job_id"] == "dlrm-a100" and p["source_gpu"] == "A100-40GB" and p["target_gpu"] == "V100-16GB"
    assert p["basis"] == "kineto"
    assert p["band_source"].startswith("structural") and p["split_source"] == "kineto kernel names"
    step = p["step_time_s"]
    assert step["low"] < step["central"] < step["high"]
    # the other trace of the pair measured the V100: the band covers it and the value is within 20 %
    v100_s = summarize_trace(V100).step_time_mean_us / 1e6
    assert step["low"] <= v100_s <= step["high"]
    assert abs(step["central"] / v100_s - 1) < 0.20
    assert p["step_time_ratio"]["central"] > 1.2  # an A100 job is slower on a V100
    assert sum(c["measured_fraction"] for c in p["categories"]) == pytest.approx(1.0, abs=1e-6)
    # the compute-bound share is the trace's GEMM-like kernels' share of its compute time (the stored summary's)
    a100 = summarize_trace(A100)
    assert a100.gpu_time is not None and a100.compute_matmul_fraction is not None
    [compute] = [c for c in p["categories"] if c["category"] == "compute_bound"]
    assert compute["measured_fraction"] == pytest.approx(
        a100.gpu_time.compute_us * a100.compute_matmul_fraction / a100.gpu_time.span_us)
    assert p["measured_power_w"] is None and p["power_source"] == "power model"  # a trace carries no power
    assert 0 < p["power_w"]["central"] <= 300  # the V100-16GB's TDP
    assert p["energy_per_step_j"]["low"] <= p["energy_per_step_j"]["central"] <= p["energy_per_step_j"]["high"]
    # an NVML device name works as well as the catalogue's
    again = api.get("/api/v1/jobs/dlrm-a100/projection", params={"gpu": "Tesla V100-SXM2-16GB"}, headers=auth(team))
    assert again.json()["step_time_s"] == step


def test_unknown_gpu_no_data_and_other_team(api, make_token):
    team, other = make_token("team", team="recsys"), make_token("team", team="vision")
    _import(api, team, "dlrm-v100", V100)
    r = api.get("/api/v1/jobs/dlrm-v100/projection", params={"gpu": "B9000"}, headers=auth(team))
    assert r.status_code == 422 and "B9000" in r.json()["detail"] and "A100-40GB" in r.json()["detail"]
    assert api.get("/api/v1/jobs/dlrm-v100/projection", params={"gpu": "L40S"},
                   headers=auth(other)).status_code == 404
    assert api.get("/api/v1/jobs/dlrm-v100/projection", headers=auth(team)).status_code == 422  # gpu is required
    assert api.post("/api/v1/jobs", json={"job_id": "empty-1"}, headers=auth(team)).status_code == 200
    r = api.get("/api/v1/jobs/empty-1/projection", params={"gpu": "L40S"}, headers=auth(team))
    assert r.status_code == 409 and "GPU type is unknown" in r.json()["detail"]


def test_cli_imports_a_trace_and_prints_its_projection(cli_env, live_server, make_token):
    env = {**cli_env, "FLEETPROF_SERVER_URL": live_server, "FLEETPROF_TOKEN": make_token("team", team="t")}
    r = subprocess.run([sys.executable, "-m", "fleetprof.cli", "import-trace", "dlrm-cli", str(V100)], env=env,
                       capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stderr
    r = subprocess.run([sys.executable, "-m", "fleetprof.cli", "projection", "dlrm-cli", "--gpu", "A100-40GB",
                        "--format", "json"], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    p = json.loads(r.stdout)
    a100_s = summarize_trace(A100).step_time_mean_us / 1e6
    assert p["step_time_s"]["low"] <= a100_s <= p["step_time_s"]["high"]
    table = subprocess.run([sys.executable, "-m", "fleetprof.cli", "projection", "dlrm-cli", "--gpu", "A100-40GB"],
                           env=env, capture_output=True, text=True, timeout=120)
    assert table.returncode == 0 and "V100-16GB -> A100-40GB (kineto basis)" in table.stdout
    bad = subprocess.run([sys.executable, "-m", "fleetprof.cli", "projection", "dlrm-cli", "--gpu", "B9000"],
                         env=env, capture_output=True, text=True, timeout=120)
    assert bad.returncode != 0 and "A100-40GB" in bad.stderr
    assert httpx.get(f"{live_server}/api/v1/jobs/dlrm-cli/projection", params={"gpu": "T4"},
                     headers=auth(env["FLEETPROF_TOKEN"])).status_code == 200


def test_telemetry_job_split_follows_its_measured_power(api, make_token):
    """Two jobs built through ingest (synthetic samples and hook steps, not NVML) on an L40S, the same steps, one
    drawing 330 W, one 150 W: the telemetry basis reads the split from each job's own draw and the band is the
    calibrated factor."""
    import math
    import time

    from server.analysis.projection.project import TELEMETRY_BAND_LOG_HALFWIDTH
    from tests.server.test_compare import _run

    op, team = make_token("operator"), make_token("team", team="vision")
    t0 = time.time() - 3600
    for job, power in (("l40s-hot", 330.0), ("l40s-cool", 150.0)):
        _run(api, op=op, writer=team, agent=make_token("agent", node=f"node-{job}"), job_id=job, team="vision",
             node=f"node-{job}", gpu_name="NVIDIA L40S", batch=32, wall_s=0.5, power_w=power, mem_gib=20.0,
             t0=t0, steps=40)
    got = {}
    for job in ("l40s-hot", "l40s-cool"):
        r = api.get(f"/api/v1/jobs/{job}/projection", params={"gpu": "H100-80GB"}, headers=auth(team))
        assert r.status_code == 200, r.text
        got[job] = r.json()
    for p in got.values():
        assert p["basis"] == "telemetry" and p["band_source"].startswith("calibrated")
        assert "power rule" in p["split_source"]
        step = p["step_time_s"]
        assert step["high"] == pytest.approx(step["central"] * math.exp(TELEMETRY_BAND_LOG_HALFWIDTH))
    shares = {job: next(c["measured_fraction"] for c in p["categories"] if c["category"] == "compute_bound")
              for job, p in got.items()}
    assert shares["l40s-hot"] > shares["l40s-cool"]
    assert got["l40s-hot"]["step_time_ratio"]["central"] != pytest.approx(got["l40s-cool"]["step_time_ratio"]["central"])


FP = "ab12" * 5  # one model's fingerprint (20 hex characters)
GPU_NAMES = {"h100": "NVIDIA H100 80GB HBM3", "a100": "NVIDIA A100-SXM4-80GB", "a100-40": "NVIDIA A100-SXM4-40GB",
             "v100": "Tesla V100-SXM2-16GB"}


def _fingerprinted_run(api, op, agent, *, job_id: str, team: str, gpu: str, batch: int, step_s: float,
                       power_w: float, seq: int, t0: float, fp: str = FP) -> None:  # type: ignore[no-untyped-def]
    """A finished 120-s run of model FP on one GPU: samples naming the GPU, steps, the hooks' framework_info."""
    import time as time_mod

    from fleetprof.protocol import PROTOCOL_VERSION
    from tests.server.helpers import sample_batch

    n = 120
    api.post("/api/v1/jobs", json={"job_id": job_id, "name": job_id, "team": team, "node": "node-a",
                                   "gpu_uuids": ["GPU-node-a-0"], "started_at": t0, "state": "running"},
             headers=auth(op))
    samples = sample_batch(seq=seq, n=n, gpus=1, t0=t0)
    samples["gpus"][0]["name"] = GPU_NAMES[gpu]
    samples["samples"]["power_w"] = [power_w] * n
    samples["samples"]["energy_counter_j"] = [1000.0 + power_w * k for k in range(n)]
    assert api.post("/api/v1/ingest/samples", json=samples, headers=auth(agent)).status_code == 200
    steps = int((n - 1) / step_s)
    events: list[dict] = [{"kind": "framework_info", "job_id": job_id, "ts": t0 + 0.5, "rank": 0, "batch_size": batch,
                           "batch_size_source": "dataloader", "fingerprint": fp, "precision": "torch.float32",
                           "framework": "pytorch"}]
    events += [{"kind": "step", "job_id": job_id, "ts": t0 + (k + 1) * step_s, "step": k, "wall_s": step_s,
                "samples": batch} for k in range(steps)]
    r = api.post("/api/v1/ingest/events", json={"protocol_version": PROTOCOL_VERSION, "source_id": f"h-{job_id}",
                                                "seq": 0, "sent_at": time_mod.time(), "events": events},
                 headers=auth(op))
    assert r.status_code == 200, r.text
    api.post("/api/v1/jobs", json={"job_id": job_id, "state": "finished", "ended_at": t0 + n - 1, "exit_code": 0},
             headers=auth(op))
    assert api.get(f"/api/v1/jobs/{job_id}/report", headers=auth(op)).status_code == 200  # stored


def test_projection_calibrated_by_the_models_runs_on_both_gpus_within_the_callers_scope(api, make_token):
    """Runs of the job's fingerprint measured on both GPU types set the ratio (the configuration nearest in batch
    size); a team token's projection uses only its team's runs, a scheduler's every team's."""
    import time as time_mod

    op, agent = make_token("operator"), make_token("agent", node="node-a")
    nlp, sched = make_token("team", team="nlp"), make_token("scheduler")
    t0 = time_mod.time() - 86400
    runs = (("nlp-h100-b32", "nlp", "h100", 32, 0.10, 500.0), ("nlp-a100-b32", "nlp", "a100", 32, 0.25, 350.0),
            ("nlp-h100-b256", "nlp", "h100", 256, 0.60, 650.0), ("nlp-a100-b256", "nlp", "a100", 256, 1.20, 390.0),
            ("vis-a100-b32", "vision", "a100", 32, 0.45, 300.0),  # another team's run of the same model
            ("nlp-h100-b64", "nlp", "h100", 64, 0.18, 550.0))     # the job projected
    for k, (job_id, team, gpu, batch, step_s, power_w) in enumerate(runs):
        _fingerprinted_run(api, op, agent, job_id=job_id, team=team, gpu=gpu, batch=batch, step_s=step_s,
                           power_w=power_w, seq=k, t0=t0 + 600 * k)
    p = api.get("/api/v1/jobs/nlp-h100-b64/projection", params={"gpu": "A100-80GB"}, headers=auth(nlp)).json()
    cal = p["calibration"]
    assert cal is not None and cal["batch_sizes"] == [32]  # log distance: 64 is nearer 32 than 256
    assert cal["source_job_ids"] == ["nlp-h100-b32"] and cal["target_job_ids"] == ["nlp-a100-b32"]
    measured = {j: api.get(f"/api/v1/jobs/{j}/report", headers=auth(op)).json() for j, *_ in runs}

    def step(j: str) -> float:
        return measured[j]["time"]["step_time_s"]["mean"]

    def energy(j: str) -> float:
        return measured[j]["energy"]["energy_per_step_j"]
    ratio = step("nlp-a100-b32") / step("nlp-h100-b32")
    assert cal["step_time_ratio"] == pytest.approx(ratio)
    assert p["step_time_s"]["central"] == pytest.approx(step("nlp-h100-b64") * ratio)
    assert p["step_time_s"]["low"] < p["step_time_s"]["central"] < p["step_time_s"]["high"]
    assert p["energy_per_step_j"]["central"] == pytest.approx(
        energy("nlp-h100-b64") * energy("nlp-a100-b32") / energy("nlp-h100-b32"))
    assert p["band_source"].startswith("calibrated by this model's runs on both GPU types (batch 32")
    assert p["power_source"].startswith("measured")
    from fleetprof.api_models import ProjectionOut
    from fleetprof.commands.projection import format_table
    table = format_table(ProjectionOut.model_validate(p))  # what `fleetprof projection` prints
    assert "calibrated by this model's runs on both types" in table and "A100-80GB runs nlp-a100-b32" in table
    # the scheduler sees the vision team's A100 run too: the median of the two A100 runs sets the ratio
    s = api.get("/api/v1/jobs/nlp-h100-b64/projection", params={"gpu": "A100-80GB"}, headers=auth(sched)).json()
    assert sorted(s["calibration"]["target_job_ids"]) == ["nlp-a100-b32", "vis-a100-b32"]
    both = (step("nlp-a100-b32") + step("vis-a100-b32")) / 2 / step("nlp-h100-b32")
    assert s["calibration"]["step_time_ratio"] == pytest.approx(both)
    # no run of the model on the target type: the datasheet roofline, no calibration
    r = api.get("/api/v1/jobs/nlp-h100-b64/projection", params={"gpu": "L40S"}, headers=auth(nlp)).json()
    assert r["calibration"] is None and r["basis"] == "telemetry"
    assert any("one run of it on L40S (any batch size) would calibrate" in n for n in r["notes"])
    # right-sizing's candidates: the A100 calibrated by the same runs, the others from the datasheets
    rs = api.get("/api/v1/jobs/nlp-h100-b64/rightsizing", headers=auth(nlp)).json()
    by_gpu = {c["gpu"]: c for c in rs["projections"]}
    assert by_gpu["A100-80GB"]["calibration_source"] == "fingerprint_runs"
    assert "measured on both types" in by_gpu["A100-80GB"]["summary"]
    assert by_gpu["A100-80GB"]["step_time_ratio"]["central"] == pytest.approx(ratio)
    assert by_gpu["L40S"]["calibration_source"] is None


def test_a_model_never_run_on_the_target_is_corrected_by_other_models_pairs(api, make_token, monkeypatch):
    """No run of the job's model on the target type: other models' runs measured on both types (two models at
    least) correct the roofline by how far it missed on them; a team that sees none of them gets the roofline."""
    import time as time_mod

    op, agent = make_token("operator"), make_token("agent", node="node-a")
    nlp, solo = make_token("team", team="nlp"), make_token("team", team="solo")
    t0 = time_mod.time() - 86400
    runs = (("m1-h100", "nlp", "h100", "c1" * 10, 0.10, 500.0), ("m1-a100", "nlp", "a100", "c1" * 10, 0.22, 350.0),
            ("m2-h100", "nlp", "h100", "c2" * 10, 0.30, 600.0), ("m2-a100", "nlp", "a100", "c2" * 10, 0.75, 380.0),
            ("new-h100", "nlp", "h100", "c3" * 10, 0.20, 550.0),   # the job: its model never ran on an A100
            ("solo-h100", "solo", "h100", "c3" * 10, 0.20, 550.0))  # the same, in a team that sees no pairs
    for k, (job_id, team, gpu, fp, step_s, power_w) in enumerate(runs):
        _fingerprinted_run(api, op, agent, job_id=job_id, team=team, gpu=gpu, batch=32, step_s=step_s,
                           power_w=power_w, seq=k, t0=t0 + 600 * k, fp=fp)
    p = api.get("/api/v1/jobs/new-h100/projection", params={"gpu": "A100-80GB"}, headers=auth(nlp)).json()
    cal = p["calibration"]
    assert cal["source"] == "fleet_pairs" and cal["models"] == 2 and cal["pairs"] == 2
    assert sorted(cal["source_job_ids"]) == ["m1-h100", "m2-h100"] and cal["step_time_ratio"] is None
    assert any("one run of it on A100-80GB" in n for n in p["notes"])
    bare = api.get("/api/v1/jobs/solo-h100/projection", params={"gpu": "A100-80GB"}, headers=auth(solo)).json()
    assert bare["calibration"] is None  # the solo team sees neither model's runs
    # the same measurement (same step time and power): the correction is the whole difference
    assert p["step_time_ratio"]["central"] == pytest.approx(bare["step_time_ratio"]["central"]
                                                           * cal["roofline_correction"])
    half = cal["band_log_halfwidth"]
    assert p["step_time_ratio"]["high"] == pytest.approx(p["step_time_ratio"]["central"] * math.exp(half))
    rs = api.get("/api/v1/jobs/new-h100/rightsizing", headers=auth(nlp)).json()
    a100 = next(c for c in rs["projections"] if c["gpu"] == "A100-80GB")
    assert a100["calibration_source"] == "fleet_pairs" and "2 other models' runs" in a100["summary"]
    # a third model measured on both types: an answer after the reuse window uses it (the grouped runs are kept
    # until a report is stored and FLEET_PAIRS_REUSE_S pass: here, no wait)
    from server.jobs import projection as projection_mod
    kept = api.get("/api/v1/jobs/new-h100/projection", params={"gpu": "A100-80GB"}, headers=auth(nlp)).json()
    monkeypatch.setattr(projection_mod, "FLEET_PAIRS_REUSE_S", 0.0)
    for k, (job_id, gpu, step_s) in enumerate((("m4-h100", "h100", 0.2), ("m4-a100", "a100", 0.9))):
        _fingerprinted_run(api, op, agent, job_id=job_id, team="nlp", gpu=gpu, batch=32, step_s=step_s,
                           power_w=500.0, seq=10 + k, t0=t0 + 600 * (10 + k), fp="c4" * 10)
    again = api.get("/api/v1/jobs/new-h100/projection", params={"gpu": "A100-80GB"}, headers=auth(nlp)).json()
    assert again["calibration"]["models"] == 3 and "m4-h100" in again["calibration"]["source_job_ids"]
    assert kept["calibration"]["models"] == 2


def test_a_trace_projection_is_not_corrected_by_other_models_pairs(api, make_token):
    """Other models' pairs correct the telemetry roofline they were measured against; a job with a Kineto trace keeps
    its per-category projection (the better one on measured pairs) even where such pairs exist."""
    import time as time_mod

    op, agent, team = make_token("operator"), make_token("agent", node="node-a"), make_token("team", team="recsys")
    t0 = time_mod.time() - 86400
    for k, (job_id, gpu, fp, step_s) in enumerate((("p1-a100", "a100-40", "d1" * 10, 0.10),
                                                  ("p1-v100", "v100", "d1" * 10, 0.18),
                                                  ("p2-a100", "a100-40", "d2" * 10, 0.30),
                                                  ("p2-v100", "v100", "d2" * 10, 0.50))):
        _fingerprinted_run(api, op, agent, job_id=job_id, team="recsys", gpu=gpu, batch=32, step_s=step_s,
                           power_w=250.0, seq=k, t0=t0 + 600 * k, fp=fp)
    _import(api, team, "dlrm-a100", A100)
    p = api.get("/api/v1/jobs/dlrm-a100/projection", params={"gpu": "V100-16GB"}, headers=auth(team)).json()
    assert p["basis"] == "kineto" and p["calibration"] is None and p["band_source"].startswith("structural")
    # the same pairs do correct a telemetry-only job between those types
    _fingerprinted_run(api, op, agent, job_id="p3-a100", team="recsys", gpu="a100-40", batch=32, step_s=0.2,
                       power_w=250.0, seq=9, t0=t0 + 6000, fp="d3" * 10)
    q = api.get("/api/v1/jobs/p3-a100/projection", params={"gpu": "V100-16GB"}, headers=auth(team)).json()
    assert q["basis"] == "telemetry" and q["calibration"]["source"] == "fleet_pairs"
