"""`fleetprof.profile()` (issue #22 part 3): real PyTorch CPU loops in subprocesses, real collectors.

Local mode runs with no FLEETPROF_* in the environment at all (no server anywhere): the report must count exactly
the loop's optimizer steps, be written next to the script as JSON and HTML, and the HTML must open in a browser.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

SCRIPTS = Path(__file__).parent / "scripts"


def _bare_env(repo_root: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEETPROF_")}
    env["PYTHONPATH"] = str(repo_root)
    return env


def _run(script: Path, args: list[str], env: dict[str, str], cwd: Path) -> list[dict[str, Any]]:
    out = subprocess.run([sys.executable, str(script), *args], env=env, cwd=cwd, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-5000:]
    return [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]


@pytest.mark.slow
def test_local_mode_writes_the_report_next_to_the_script(repo_root: Path, tmp_path: Path) -> None:
    script = tmp_path / "train.py"  # the report goes beside the script, wherever it is run from
    shutil.copy(SCRIPTS / "train_block.py", script)
    elsewhere = tmp_path / "cwd"
    elsewhere.mkdir()
    blocks = _run(script, ["23", "7", "11"], _bare_env(repo_root), cwd=elsewhere)
    assert [b["tag"] for b in blocks] == ["with", "decorator", "decorator", "raised"]
    assert len({b["job_id"] for b in blocks}) == 4  # one job per block, one per decorated call

    for b in blocks:
        assert b["mode"] == "local" and b["hooks"] is True
        json_path, html_path = Path(b["json"]), Path(b["html"])
        assert json_path.parent == tmp_path and html_path.parent == tmp_path
        report = json.loads(json_path.read_text())
        assert report["job_id"] == b["job_id"]
        assert report["time"]["steps"] == b["counted"], b  # exactly the loop's optimizer steps
        assert report["state"] == ("failed" if b["tag"] == "raised" else "finished")
        assert report["framework"]["optimizers"] == ["SGD"]
        assert report["framework"]["batch_size_observed"] == 8
        assert report["time"]["step_time_s"]["p50"] > 0
        html = html_path.read_text()
        assert b["job_id"] in html
    assert json.loads(Path(blocks[0]["json"]).read_text())["name"] == "block-test"
    assert json.loads(Path(blocks[0]["json"]).read_text())["team"] == "local-team"
    assert list(elsewhere.iterdir()) == []  # nothing left in the working directory (temporary collector removed)


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["torch", "jax"])
def test_local_mode_counts_a_keras_fit_and_a_jax_train_step(repo_root: Path, tmp_path: Path, backend: str) -> None:
    """A Keras `fit` (2 epochs of 100 samples at 32: 4 batches each, the last short) and a JAX `@train_step` loop,
    each in its own local-mode block: the reports count exactly the program's own batches and calls."""
    script = tmp_path / "keras_train.py"
    shutil.copy(SCRIPTS / "keras_block.py", script)
    keras_block, jax_block = _run(script, ["2", "32", "7"], {**_bare_env(repo_root), "KERAS_BACKEND": backend},
                                  cwd=tmp_path)
    assert keras_block["counted"] == 8 and jax_block["counted"] == 7
    for b in (keras_block, jax_block):
        assert b["mode"] == "local" and b["state"] == "finished" and {"keras", "jax"} <= set(b["hooked"])
    keras_report = json.loads(Path(keras_block["json"]).read_text())
    assert keras_report["time"]["steps"] == keras_block["counted"]  # every train batch of the fit, once
    assert keras_report["time"]["samples"] == 2 * 100
    assert keras_report["framework"]["optimizers"] == ["RMSprop"]
    assert keras_report["framework"]["batch_size_observed"] == 32
    fp = keras_report["fingerprint"]
    assert fp["framework"] == "keras" and fp["fingerprint"] is not None and fp["precision"] == "fp32"
    assert fp["module_count"] == 3 and fp["parameter_count"] == 12 * 16 + 16 + 16 + 1

    jax_report = json.loads(Path(jax_block["json"]).read_text())
    assert jax_report["time"]["steps"] == jax_block["counted"] and jax_report["time"]["samples"] == 70
    jfp = jax_report["fingerprint"]
    assert jfp["framework"] == "jax" and jfp["fingerprint"] is not None and jfp["fingerprint"] != fp["fingerprint"]
    assert jfp["parameter_count"] == 12 + 1 and jfp["batch_size"] == 10


@pytest.mark.slow
def test_a_framework_imported_inside_the_block_is_hooked(repo_root: Path, tmp_path: Path) -> None:
    """A decorated main() that imports Keras (torch backend: Keras imports torch, and jax, on the way) inside the
    profiled call: the hooks go in as the program imports them, and the fit's batches are counted once."""
    script = tmp_path / "main.py"
    shutil.copy(SCRIPTS / "keras_inside.py", script)
    (result,) = _run(script, ["2", "16"], {**_bare_env(repo_root), "KERAS_BACKEND": "torch"}, cwd=tmp_path)
    assert result["before"] == []  # nothing imported before the block
    assert result["counted"] == 8 and {"keras", "torch"} <= set(result["hooked"])
    report = json.loads(Path(result["json"]).read_text())
    assert report["time"]["steps"] == result["counted"]  # Keras's steps; the PyTorch hooks stood down in fit
    assert report["time"]["samples"] == 2 * 60
    assert report["fingerprint"]["framework"] == "keras" and report["fingerprint"]["fingerprint"] is not None


@pytest.mark.browser
@pytest.mark.slow
def test_local_report_html_opens_in_a_browser(repo_root: Path, tmp_path: Path) -> None:
    from tests.dashboard.conftest import make_chrome

    script = tmp_path / "train.py"
    shutil.copy(SCRIPTS / "train_block.py", script)
    first = _run(script, ["5", "1", "1"], _bare_env(repo_root), cwd=tmp_path)[0]
    driver = make_chrome()
    try:
        driver.get(Path(first["html"]).as_uri())
        assert first["job_id"] in driver.title
        body = driver.find_element("tag name", "body").text
        assert "5" in body and first["job_id"] in body
        severe = [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]
        assert severe == []
    finally:
        driver.quit()


def test_a_block_without_torch_still_gets_a_report(repo_root: Path, tmp_path: Path) -> None:
    script = tmp_path / "plain.py"
    shutil.copy(SCRIPTS / "no_torch.py", script)
    (result,) = _run(script, [], _bare_env(repo_root), cwd=tmp_path)
    assert result["hooks"] is False and result["torch_imported"] is False
    assert result["imported"] == []  # no framework imported on the program's behalf (torch, keras, jax)
    report = json.loads(Path(result["json"]).read_text())
    assert report["job_id"] == result["job_id"] and report["state"] == "finished"
    assert report["time"]["steps"] is None  # unknown without hooks, never 0
    assert report["duration_s"] is not None and report["duration_s"] >= 0.3


@pytest.mark.slow
def test_server_mode_sends_to_the_configured_collector(repo_root: Path, tmp_path: Path, live_server: str,
                                                       make_token, cli_env: dict[str, str]) -> None:
    from fleetprof.client import Client

    token = make_token("team", team="vision")
    env = {**cli_env, "PYTHONPATH": str(repo_root), "FLEETPROF_SERVER_URL": live_server, "FLEETPROF_TOKEN": token}
    script = tmp_path / "server_block.py"
    shutil.copy(SCRIPTS / "server_block.py", script)
    (result,) = _run(script, ["pyapi-server-1", "17"], env, cwd=tmp_path)
    assert result == {"job_id": "pyapi-server-1", "mode": "server", "json": "None", "hooks": True}
    assert not list(tmp_path.glob("fleetprof-*"))  # server mode writes no local files
    with Client(live_server, token) as api:
        job = api.job("pyapi-server-1")
        assert job["state"] == "finished" and job["team"] == "vision"
        assert job["metadata"]["profiled_by"] == "fleetprof.profile"
        report = api.report_json("pyapi-server-1", refresh=True)
    assert report["time"]["steps"] == 17
    assert report["framework"]["optimizers"] == ["Adam"]


@pytest.mark.slow
def test_local_mode_samples_the_machines_gpus(tmp_path: Path) -> None:
    """NVML-level profiling of a block without torch hooks: the node agent's sampler runs into the local collector.
    No GPU here: the agent's NVML test double (`fake:1`, batches labelled source "test") stands in for NVML."""
    import time

    from embedded.profile import Block
    from fleetprof.profiling import ProfileOptions

    uuid = "GPU-fake0000-0000-0000-0000-000000000000"
    block = Block(ProfileOptions(name="nvml-only", local=True, hooks=False, output_dir=tmp_path),
                  nvml_source="fake:1", gpu_uuids=[uuid])
    time.sleep(3.5)  # a few 1 s samples and 1 s batches
    result = block.finish(None)
    assert result.mode == "local" and result.hooks is False
    report = json.loads(Path(str(result.report_json_path)).read_text())
    (gpu,) = report["gpus"]
    assert gpu["uuid"] == uuid
    assert gpu["peak_used_bytes"] is not None and gpu["peak_used_bytes"] > 0
    assert report["memory"]["peak_used_bytes"] == gpu["peak_used_bytes"]
    assert report["utilization"]["gpu_mean_pct"] is not None
    assert report["time"]["steps"] is None  # no hooks: unknown


@pytest.mark.slow
def test_a_nested_block_leaves_the_steps_to_the_outer_one(repo_root: Path, tmp_path: Path) -> None:
    script = tmp_path / "nested.py"
    shutil.copy(SCRIPTS / "nested.py", script)
    outer, inner = _run(script, [], _bare_env(repo_root), cwd=tmp_path)
    assert (outer["hooks"], inner["hooks"]) == (True, False)
    assert json.loads(Path(outer["json"]).read_text())["time"]["steps"] == 9
    assert json.loads(Path(inner["json"]).read_text())["time"]["steps"] is None


UNREACHABLE = """
import json, socket
import torch
import fleetprof

s = socket.socket(); s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]; s.close()  # nothing listens there
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
with fleetprof.profile(job_id="unreachable-1", server_url=f"http://127.0.0.1:{port}", token="fp_x") as p:
    for _ in range(5):
        model(torch.randn(2, 4)).sum().backward()
        opt.step()
        opt.zero_grad()
print(json.dumps({"mode": p.result.mode, "state": p.result.state}))
"""


def test_an_unreachable_server_never_stops_the_block(repo_root: Path, tmp_path: Path) -> None:
    script = tmp_path / "unreachable.py"
    script.write_text(UNREACHABLE)
    out = subprocess.run([sys.executable, str(script)], env=_bare_env(repo_root), cwd=tmp_path, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.splitlines()[-1])
    assert result["mode"] == "server" and result["state"] == "finished"
    assert "not registered" in out.stderr  # said once, as a warning
    assert not list(tmp_path.glob("fleetprof-*"))


OOM_SCRIPT = """
import json
import torch
import fleetprof

model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
block = fleetprof.profile(name="oom")
try:
    with block:
        for _ in range(3):
            model(torch.randn(2, 4)).sum().backward()
            opt.step()
            opt.zero_grad()
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
except torch.OutOfMemoryError:
    pass
print(json.dumps({"state": block.result.state, "json": str(block.result.report_json_path)}))
"""


def test_an_out_of_memory_error_marks_the_job_oom(repo_root: Path, tmp_path: Path) -> None:
    script = tmp_path / "oom.py"
    script.write_text(OOM_SCRIPT)
    out = subprocess.run([sys.executable, str(script)], env=_bare_env(repo_root), cwd=tmp_path, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.splitlines()[-1])
    assert result["state"] == "oom"
    report = json.loads(Path(result["json"]).read_text())
    assert report["state"] == "oom" and report["time"]["steps"] == 3
    assert report["memory"]["oom_detected"] is True
