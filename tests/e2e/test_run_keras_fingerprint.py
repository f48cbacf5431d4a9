"""Keras fingerprints (issue #21's rule over a Keras layer tree): unmodified Keras `Model.fit` scripts under
`fleetprof run` against a real `fleetprof server`. One model run at two batch sizes on the torch backend and at a third
on the JAX backend under a mixed_float16 policy (where `compile` wraps the optimizer in a LossScaleOptimizer) shares
one fingerprint; another model does not; `GET /api/v1/jobs?fingerprint=` lists exactly the three runs.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import httpx

from tests.e2e.conftest import FLEETPROF, client_env

SCRIPTS = Path(__file__).parents[1] / "hooks" / "scripts"


def _get(url: str, token: str, path: str, **params: str) -> dict:
    r = httpx.get(f"{url}{path}", params=params, headers={"Authorization": f"Bearer {token}"}, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()


def _run(env: dict[str, str], job_id: str, out: Path, backend: str, *args: str) -> dict:
    proc = subprocess.run([*FLEETPROF, "run", "--job-id", job_id, "--", sys.executable,
                           str(SCRIPTS / "keras_models.py"), str(out), *args], env={**env, "KERAS_BACKEND": backend},
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(out.read_text())


def test_keras_runs_of_one_model_share_a_fingerprint_across_batch_size_backend_and_precision(
        live_server: str, cli_env, make_token, tmp_path: Path) -> None:
    token = make_token("team", team="e2e-keras-fp")
    env = client_env(cli_env, live_server, token)
    own = {"kfp-cnn-b16": _run(env, "kfp-cnn-b16", tmp_path / "a.json", "torch", "cnn", "16"),
           "kfp-cnn-b48": _run(env, "kfp-cnn-b48", tmp_path / "b.json", "torch", "cnn", "48"),
           "kfp-cnn-jax-f16": _run(env, "kfp-cnn-jax-f16", tmp_path / "c.json", "jax", "cnn", "32", "mixed_float16"),
           "kfp-mlp-b16": _run(env, "kfp-mlp-b16", tmp_path / "d.json", "torch", "mlp", "16")}
    assert own["kfp-cnn-jax-f16"]["optimizer"] == "LossScaleOptimizer"  # Keras wrapped the script's Adam

    section = {j: _get(live_server, token, f"/api/v1/jobs/{j}/report")["fingerprint"] for j in own}
    fp = section["kfp-cnn-b16"]["fingerprint"]
    assert fp is not None and len(fp) == 20
    assert section["kfp-cnn-b48"]["fingerprint"] == fp  # another batch size
    assert section["kfp-cnn-jax-f16"]["fingerprint"] == fp  # another backend and precision
    assert section["kfp-mlp-b16"]["fingerprint"] not in (None, fp)  # another model
    for job_id, s in section.items():
        assert s["framework"] == "keras" and s["framework_version"].startswith("3.") and s["source"] == "hooks"
        assert s["optimizers"] == ["Adam"], job_id  # inside the LossScaleOptimizer
        assert s["module_tree_hash"] is not None and s["model_class"].endswith(own[job_id]["model"])
    assert {j: section[j]["batch_size"] for j in own} == {"kfp-cnn-b16": 16, "kfp-cnn-b48": 48, "kfp-cnn-jax-f16": 32,
                                                          "kfp-mlp-b16": 16}
    assert section["kfp-cnn-b16"]["precision"] == "fp32" and section["kfp-cnn-jax-f16"]["precision"] == "amp_fp16"
    # the cnn: the model, its nested block and its 3 layers, the shared conv (once), pooling, dropout, head
    assert section["kfp-cnn-b16"]["module_count"] == 9
    for job_id in own:
        report = _get(live_server, token, f"/api/v1/jobs/{job_id}/report")
        assert report["time"]["steps"] == own[job_id]["steps"]

    listed = _get(live_server, token, "/api/v1/jobs", fingerprint=fp)
    assert sorted(j["job_id"] for j in listed["items"]) == ["kfp-cnn-b16", "kfp-cnn-b48", "kfp-cnn-jax-f16"]
