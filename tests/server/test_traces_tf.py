"""`fleetprof import-trace` with a real TensorFlow profiler trace (the trace viewer's `<host>.trace.json.gz`):
uploaded as it is, recognised on the server, and its steps and layer scopes in the job's report."""

from __future__ import annotations

import subprocess
import sys

import httpx

from tests.server.helpers import auth


def test_import_trace_reads_a_tensorflow_profiler_trace(cli_env, live_server, make_token, real_data):
    token = make_token("team", team="tf")
    env = {**cli_env, "FLEETPROF_SERVER_URL": live_server, "FLEETPROF_TOKEN": token}
    path = real_data / "tf-profiler/keras-cnn-cpu.trace.json.gz"
    r = subprocess.run([sys.executable, "-m", "fleetprof.cli", "import-trace", "tf-job-1", str(path)], env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "uploaded as kineto" in r.stderr  # the trace-event JSON family; the summary says which profiler

    report = httpx.get(f"{live_server}/api/v1/jobs/tf-job-1/report", headers=auth(token), timeout=60).json()
    assert report["traces"]["kineto_files"] == 1
    (rank0,) = report["traces"]["kineto"]["per_rank"]
    assert rank0["format"] == "tensorflow" and rank0["steps"] == 3 and rank0["step_time_mean_us"] > 0
    scopes = [s["scope"] for s in rank0["scopes"]]
    assert scopes[0] == "sequential_1/conv_1" and "sequential_1/head_1" in scopes
    assert rank0["compute_pct"] is None  # a CPU profile: no GPU time, unknown rather than 0
