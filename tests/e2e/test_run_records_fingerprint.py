"""Issue #21 acceptance: two CPU runs of the same unmodified script at different batch sizes (and one with bf16
autocast) share a fingerprint; a run of another model does not. Real `fleetprof run` of real PyTorch scripts
through a real collector, then `GET /api/v1/jobs?fingerprint=` returns exactly the matching jobs, scoped by team.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import httpx

from tests.e2e.conftest import FLEETPROF, client_env

SCRIPTS = Path(__file__).parents[1] / "hooks" / "scripts"


def _get(url: str, token: str, path: str, **params: str) -> httpx.Response:
    return httpx.get(f"{url}{path}", params=params, headers={"Authorization": f"Bearer {token}"}, timeout=60)


def _run(env: dict[str, str], job_id: str, script: str, *args: str) -> None:
    proc = subprocess.run([*FLEETPROF, "run", "--job-id", job_id, "--", sys.executable, str(SCRIPTS / script),
                           *args], env=env, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr


def test_runs_of_one_model_share_a_fingerprint_and_another_model_does_not(live_server: str, cli_env,
                                                                           make_token) -> None:
    token = make_token("team", team="e2e-fp")
    env = client_env(cli_env, live_server, token)
    _run(env, "fp-loader-b8", "train_loader.py", "8", "4")
    _run(env, "fp-loader-b24", "train_loader.py", "24", "4")
    _run(env, "fp-loader-b8-bf16", "train_loader.py", "8", "4", "--autocast")
    _run(env, "fp-cnn", "train_cnn.py", "4")
    # the same script in another team: the same fingerprint, not visible to this team's token
    other = make_token("team", team="e2e-fp-other")
    _run(client_env(cli_env, live_server, other), "fp-loader-other-team", "train_loader.py", "16", "3")

    jobs = {j: _get(live_server, token, f"/api/v1/jobs/{j}").json()
            for j in ("fp-loader-b8", "fp-loader-b24", "fp-loader-b8-bf16", "fp-cnn")}
    fp = jobs["fp-loader-b8"]["fingerprint"]
    assert fp is not None and len(fp) == 20
    assert jobs["fp-loader-b24"]["fingerprint"] == fp and jobs["fp-loader-b8-bf16"]["fingerprint"] == fp
    assert jobs["fp-cnn"]["fingerprint"] not in (None, fp)
    assert {jobs["fp-loader-b8"]["batch_size"], jobs["fp-loader-b24"]["batch_size"]} == {8, 24}

    listed = _get(live_server, token, "/api/v1/jobs", fingerprint=fp)
    assert listed.status_code == 200, listed.text
    assert sorted(j["job_id"] for j in listed.json()["items"]) == ["fp-loader-b24", "fp-loader-b8",
                                                                    "fp-loader-b8-bf16"]
    assert listed.json()["total"] == 3
    cnn = _get(live_server, token, "/api/v1/jobs", fingerprint=jobs["fp-cnn"]["fingerprint"]).json()
    assert [j["job_id"] for j in cnn["items"]] == ["fp-cnn"]
    operator = make_token("operator")
    everyone = _get(live_server, operator, "/api/v1/jobs", fingerprint=fp).json()
    assert "fp-loader-other-team" in {j["job_id"] for j in everyone["items"]} and everyone["total"] == 4

    # the parts, in the report: the configuration axes beside the id
    section = {j: _get(live_server, token, f"/api/v1/jobs/{j}/report").json()["fingerprint"]
               for j in ("fp-loader-b8", "fp-loader-b24", "fp-loader-b8-bf16", "fp-cnn")}
    b8 = section["fp-loader-b8"]
    assert b8["fingerprint"] == fp and b8["source"] == "hooks" and b8["framework"] == "pytorch"
    assert b8["model_class"] == "__main__.ConvNet" and b8["optimizers"] == ["Adam"]
    assert b8["parameter_count"] > 0 and b8["module_count"] == 4 and len(b8["module_tree_hash"]) == 64
    assert b8["precision"] == "fp32" and section["fp-loader-b8-bf16"]["precision"] == "amp_bf16"
    assert b8["batch_size"] == 8 and section["fp-loader-b24"]["batch_size"] == 24
    assert b8["framework_version"] == section["fp-loader-b24"]["framework_version"] is not None
    assert section["fp-cnn"]["optimizers"] == ["SGD"] and section["fp-cnn"]["model_class"] == "__main__.SmallCNN"

    # the CLI's table shows the section
    table = subprocess.run([*FLEETPROF, "report", "fp-loader-b8"], env=env, capture_output=True, text=True,
                           timeout=60)
    assert table.returncode == 0, table.stderr
    assert "[fingerprint]" in table.stdout and fp in table.stdout

    # characterization across configurations: the three runs of the fingerprint, by batch size and precision
    ch = _get(live_server, token, "/api/v1/jobs/characterization", fingerprint=fp)
    assert ch.status_code == 200, ch.text
    ch_doc = ch.json()
    assert ch_doc["runs_total"] == 3 and ch_doc["model_class"] == "__main__.ConvNet"
    assert sorted(ch_doc["axes_varied"]) == ["batch_size", "precision"]
    confs = {(c["batch_size"], c["precision"]): c for c in ch_doc["configurations"]}
    assert set(confs) == {(8, "fp32"), (24, "fp32"), (8, "amp_bf16")}
    for c in confs.values():
        assert c["gpu_type"] == "cpu" and c["gpu_count"] == 0 and c["runs"] == 1
        assert c["samples_per_s"] > 0 and c["step_time_s"] > 0 and c["peak_memory_bytes"] > 0
        assert c["cost_per_step_usd"] is None and c["energy_per_step_j"] is None  # a CPU: no price, no counter
    by_axis = {f["axis"]: f for f in ch_doc["findings"]}
    assert set(by_axis) == {"batch_size", "precision"}  # (24, fp32) vs (8, amp_bf16) differ in two axes
    thr = next(r for r in by_axis["precision"]["ratios"] if r["figure"] == "samples_per_s")
    assert thr["ratio"] == thr["value"] / thr["baseline"]
    assert thr["baseline"] == confs[(8, "fp32")]["samples_per_s"] and thr["unit"] == "samples/s"
    assert by_axis["precision"]["summary"].startswith("amp_bf16 vs fp32 (precision)")
    chosen = _get(live_server, token, "/api/v1/jobs/characterization", ids="fp-loader-b8,fp-cnn").json()
    assert chosen["fingerprint"] is None and any("fingerprints" in n for n in chosen["notes"])
    assert _get(live_server, token, "/api/v1/jobs/characterization",
                ids="fp-loader-b8,fp-loader-other-team").status_code == 404  # another team's job
    assert _get(live_server, token, "/api/v1/jobs/characterization").status_code == 422
    assert _get(live_server, token, "/api/v1/jobs/characterization", fingerprint=fp,
                ids="fp-loader-b8,fp-cnn").status_code == 422

    # bad input: a clear 422, never a 500
    assert _get(live_server, token, "/api/v1/jobs", fingerprint="not-a-fingerprint").status_code == 422
