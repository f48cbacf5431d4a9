"""Where teams track runs (issue #22 part 5): a real job's report logged to MLflow's local file store and to W&B in
offline mode, through `fleetprof report --to` and `fleetprof.profile(log_to=...)`, and read back from each."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from fleetprof.trackers import PREFIX, headline_metrics, headline_params, log_report
from tests.trackers.wandb_offline import offline_run, offline_runs

SCRIPTS = Path(__file__).resolve().parents[1] / "profile/scripts"


def _tracker_env(tmp_path: Path) -> dict[str, str]:
    """MLflow's file store and W&B offline, everything under tmp_path (no home directory, no network)."""
    return {"MLFLOW_TRACKING_URI": (tmp_path / "mlruns").as_uri(), "MLFLOW_ALLOW_FILE_STORE": "true",
            "WANDB_MODE": "offline", "WANDB_DIR": str(tmp_path), "WANDB_DATA_DIR": str(tmp_path / "wandb-data"),
            "WANDB_CACHE_DIR": str(tmp_path / "wandb-cache"), "WANDB_CONFIG_DIR": str(tmp_path / "wandb-config"),
            "WANDB_SILENT": "true", "HOME": str(tmp_path)}


def _check_mlflow(tmp_path: Path, run_id: str, report: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    from mlflow.tracking import MlflowClient

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3 reads its file store only when told to

    client = MlflowClient((tmp_path / "mlruns").as_uri())
    run = client.get_run(run_id)
    assert run.data.metrics[PREFIX + "steps"] == report["time"]["steps"]
    assert run.data.metrics[PREFIX + "step_time_p50_s"] == pytest.approx(report["time"]["step_time_s"]["p50"])
    assert run.data.metrics[PREFIX + "duration_s"] == pytest.approx(report["duration_s"])
    assert PREFIX + "energy_j" not in run.data.metrics  # unknown on this CPU: left out, never 0
    assert run.data.params[PREFIX + "job_id"] == report["job_id"]
    assert sorted(a.path for a in client.list_artifacts(run_id, "fleetprof")) == \
        ["fleetprof/report.html", "fleetprof/report.json"]
    got = Path(client.download_artifacts(run_id, "fleetprof/report.json", str(tmp_path / "dl")))
    assert json.loads(got.read_text()) == report
    html = Path(client.download_artifacts(run_id, "fleetprof/report.html", str(tmp_path / "dl")))
    assert report["job_id"] in html.read_text()


def _check_wandb(tmp_path: Path, report: dict[str, Any]) -> None:
    run = offline_run(tmp_path)
    assert run["summary"][PREFIX + "steps"] == report["time"]["steps"]
    assert run["summary"][PREFIX + "step_time_p50_s"] == pytest.approx(report["time"]["step_time_s"]["p50"])
    assert PREFIX + "energy_j" not in run["summary"]
    assert run["config"][PREFIX + "job_id"] == report["job_id"]
    (artifact,) = run["artifacts"]
    assert artifact["type"] == "fleetprof-report"
    assert sorted(artifact["files"]) == ["fleetprof/report.html", "fleetprof/report.json"]
    assert json.loads(Path(artifact["files"]["fleetprof/report.json"]).read_text()) == report


def test_headline_metrics_carry_units_and_leave_unknowns_out() -> None:
    report = {"job_id": "j", "state": "finished", "duration_s": 12.5,
              "memory": {"peak_used_bytes": 3 << 30, "peak_allocated_bytes": None},
              "time": {"steps": 40, "step_time_s": {"mean": 0.2, "p50": 0.19, "p95": None}, "mfu_fraction": 0.41},
              "energy": {"energy_j": 0, "source": "counter"}, "gpus": [{"name": "NVIDIA H100 80GB HBM3"}]}
    m = headline_metrics(report)
    assert m == {PREFIX + "peak_used_bytes": float(3 << 30), PREFIX + "steps": 40.0,
                 PREFIX + "step_time_mean_s": 0.2, PREFIX + "step_time_p50_s": 0.19, PREFIX + "energy_j": 0.0,
                 PREFIX + "duration_s": 12.5, PREFIX + "mfu_fraction": 0.41}
    p = headline_params(report)
    assert p[PREFIX + "gpu_name"] == "NVIDIA H100 80GB HBM3" and p[PREFIX + "energy_source"] == "counter"


@pytest.mark.slow
def test_report_to_mlflow_and_wandb_from_the_cli(repo_root: Path, tmp_path: Path, live_server: str, make_token,
                                                 cli_env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    token = make_token("team", team="vision")
    env = {**cli_env, **_tracker_env(tmp_path), "PYTHONPATH": str(repo_root), "FLEETPROF_SERVER_URL": live_server,
           "FLEETPROF_TOKEN": token}
    shutil.copy(SCRIPTS / "server_block.py", tmp_path / "server_block.py")
    subprocess.run([sys.executable, str(tmp_path / "server_block.py"), "pyapi-trk-1", "13"], env=env, cwd=tmp_path,
                   check=True, capture_output=True, timeout=300)
    out = subprocess.run([sys.executable, "-m", "fleetprof.cli", "report", "pyapi-trk-1", "--format", "json",
                          "--refresh", "--to", "mlflow", "--to", "wandb", "--project", "fleetprof-test"],
                         env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads(out.stdout)
    assert report["time"]["steps"] == 13
    (mlflow_run,) = [line.rsplit(" ", 1)[1] for line in out.stderr.splitlines() if "to mlflow: run" in line]
    _check_mlflow(tmp_path, mlflow_run, report, monkeypatch)
    _check_wandb(tmp_path, report)


LOG_TO_SCRIPT = """
import json, sys
import torch
import fleetprof

model = torch.nn.Linear(8, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
with fleetprof.profile(name="tracked", log_to=("mlflow", "wandb")) as p:
    for _ in range(9):
        model(torch.randn(4, 8)).sum().backward()
        opt.step()
        opt.zero_grad()
print(json.dumps({"json": str(p.result.report_json_path), "runs": p.result.tracker_runs}))
"""


@pytest.mark.slow
def test_profile_block_logs_to_both_trackers_in_local_mode(repo_root: Path, tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FLEETPROF_", "MLFLOW_", "WANDB_"))}
    env.update(_tracker_env(tmp_path), PYTHONPATH=str(repo_root))
    script = tmp_path / "tracked.py"
    script.write_text(LOG_TO_SCRIPT)
    out = subprocess.run([sys.executable, str(script)], env=env, cwd=tmp_path, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.splitlines()[-1])
    report = json.loads(Path(result["json"]).read_text())
    assert report["time"]["steps"] == 9
    assert set(result["runs"]) == {"mlflow", "wandb"}
    _check_mlflow(tmp_path, result["runs"]["mlflow"], report, monkeypatch)
    _check_wandb(tmp_path, report)


def test_two_jobs_into_one_active_mlflow_run_become_child_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import mlflow
    from mlflow.tracking import MlflowClient

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    uri = (tmp_path / "mlruns").as_uri()
    mlflow.set_tracking_uri(uri)
    try:
        with mlflow.start_run(run_name="user's run") as parent:
            first = log_report({"job_id": "a", "time": {"steps": 3}}, to="mlflow")
            second = log_report({"job_id": "b", "time": {"steps": 5}}, to="mlflow")
    finally:
        mlflow.set_tracking_uri("")
    client = MlflowClient(uri)
    assert first == parent.info.run_id  # the user's run took the first job
    child = client.get_run(second)
    assert child.data.tags["mlflow.parentRunId"] == parent.info.run_id
    assert child.data.metrics[PREFIX + "steps"] == 5 and client.get_run(first).data.metrics[PREFIX + "steps"] == 3


WANDB_TWO_JOBS = """
import wandb
from fleetprof.trackers import log_report

user = wandb.init(project="p", name="user-run")
first = log_report({"job_id": "a", "time": {"steps": 3}}, to="wandb")
second = log_report({"job_id": "b", "time": {"steps": 5}}, to="wandb")
assert first == user.id != second and wandb.run is user, (first, second, user.id)
user.finish()
"""


def test_two_jobs_into_one_active_wandb_run_get_a_run_each(repo_root: Path, tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FLEETPROF_", "WANDB_"))}
    env.update(_tracker_env(tmp_path), PYTHONPATH=str(repo_root))
    work = tmp_path / "work"  # not tmp_path: a `wandb` folder in the working directory would shadow the package
    work.mkdir()
    out = subprocess.run([sys.executable, "-c", WANDB_TWO_JOBS], env=env, cwd=work, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    runs = {r["name"]: r for r in offline_runs(tmp_path)}
    assert set(runs) == {"user-run", "b"}
    assert runs["user-run"]["summary"][PREFIX + "steps"] == 3 and runs["user-run"]["config"][PREFIX + "job_id"] == "a"
    assert runs["b"]["summary"][PREFIX + "steps"] == 5 and runs["b"]["config"][PREFIX + "job_id"] == "b"
