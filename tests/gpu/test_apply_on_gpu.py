"""Issue #18 on a real GPU: a variable-length transformer job under `fleetprof run --trace-allocator` gets an
allocator-settings recommendation simulated from its own CUDA allocator trace; `fleetprof run --apply` of it sets
PYTORCH_CUDA_ALLOC_CONF in the second run, and GET /jobs/compare shows the saving the simulation predicted beside
the one the second run realized (both from torch.cuda's reserved peak, in bytes). Figures printed (`-s`) and, when
FLEETPROF_GPU_EVIDENCE names a folder, the reports and the comparison written there as JSON."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import httpx

from tests.e2e.conftest import FLEETPROF, client_env

SCRIPT = Path(__file__).resolve().parent / "scripts" / "train_varlen.py"
STEPS = "40"


def _evidence(name: str, doc: object) -> None:
    folder = os.environ.get("FLEETPROF_GPU_EVIDENCE")
    if folder:
        Path(folder).mkdir(parents=True, exist_ok=True)
        (Path(folder) / name).write_text(json.dumps(doc, indent=1, default=str))


def _run(env: dict[str, str], job_id: str, *flags: str) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([*FLEETPROF, "run", "--job-id", job_id, "--name", "gpu-varlen", "--trace-allocator", "6",
                           *flags, "--", sys.executable, str(SCRIPT), STEPS, "cuda"],
                          env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def test_allocator_setting_applied_and_realized_on_cuda(live_server, cli_env, make_token) -> None:
    token = make_token("team", team="gpu")
    headers = {"Authorization": f"Bearer {token}"}
    env = client_env(cli_env, live_server, token)
    _run(env, "varlen-before")
    report = httpx.get(f"{live_server}/api/v1/jobs/varlen-before/report", params={"refresh": "true"},
                       headers=headers, timeout=300).json()
    _evidence("varlen_before_report.json", report)
    mem = report["memory"]
    print("before:", {k: mem.get(k) for k in ("peak_allocated_bytes", "peak_reserved_bytes", "peak_used_bytes")},
          [(r["kind"], r.get("saving"), (r.get("evidence") or {}).get("env")) for r in report["recommendations"]])
    assert 0 < mem["peak_allocated_bytes"] <= mem["peak_reserved_bytes"]
    recs = [r for r in report["recommendations"] if r["kind"] == "allocator_settings"]
    assert recs, "a variable-length job's allocator trace should yield an allocator-settings recommendation"
    setting = recs[0]["evidence"]["env"]

    second = _run(env, "varlen-after", "--apply", "varlen-before")
    assert f"applied allocator_settings from varlen-before: {setting}" in second.stderr
    after = httpx.get(f"{live_server}/api/v1/jobs/varlen-after/report", params={"refresh": "true"},
                      headers=headers, timeout=300).json()
    _evidence("varlen_after_report.json", after)
    r = httpx.get(f"{live_server}/api/v1/jobs/compare", params={"ids": "varlen-before,varlen-after"},
                  headers=headers, timeout=300)
    assert r.status_code == 200, r.text
    _evidence("varlen_compare.json", r.json())
    [applied] = r.json()["jobs"][1]["applied"]
    print("applied:", applied)
    [realized] = [x for x in applied["realized"] if x["figure"] == "peak_reserved_bytes"]
    # a CUDA run with hooks measures its reserved peak: the realized saving is known (whatever its sign)
    assert realized["before"] == mem["peak_reserved_bytes"] and realized["after"] is not None
    assert realized["saving"] == realized["before"] - realized["after"]
