"""bench/validate_gpu.py (`make validate-gpu`) off a GPU: refuses in one line with a non-zero status; and the two
things it writes from a measurement (the calibration entry, the results table) read back as measured."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from bench.validate_gpu import CALIBRATION, error_fraction, render_markdown, update_calibration
from server.analysis.base.gpu_catalog import find_model
from server.estimate.calibration import calibration_for


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU: make validate-gpu measures it")
def test_without_a_gpu_one_line_and_a_failing_status(repo_root: Path) -> None:
    r = subprocess.run([sys.executable, "bench/validate_gpu.py", "--no-calibration"], cwd=repo_root,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2
    assert r.stderr.strip().count("\n") == 0 and "no CUDA GPU" in r.stderr
    assert not list((repo_root / "bench" / "results").glob("gpu_*.md.tmp"))


def test_measured_calibration_entry_is_used(tmp_path: Path) -> None:
    path = tmp_path / "calibration.json"
    shutil.copy(CALIBRATION, path)
    h200 = find_model("H200")
    assert h200 is not None and not calibration_for(h200, path).measured
    update_calibration(path, "H200", context_bytes=512 * 2**20 + 4096, cublas_workspace_bytes=33554432,
                       device="NVIDIA H200", driver="550.54.15", torch_version="2.13.0", date="2026-11-25")
    cal = calibration_for(h200, path)
    assert cal.measured and cal.context_bytes == 512 * 2**20 + 4096 and cal.cublas_workspace_bytes == 33554432
    assert "NVIDIA H200" in cal.source and "550.54.15" in cal.source
    a100 = find_model("A100-40GB")
    assert a100 is not None and not calibration_for(a100, path).measured  # other entries untouched


def test_results_table_puts_the_error_beside_each_figure() -> None:
    measured = {"allocated_bytes": 100 * 2**20, "reserved_bytes": 120 * 2**20, "nvml_used_bytes": None,
                "step_s": 0.010, "energy_j": 2.0}
    est = {"allocated_bytes": 90 * 2**20, "reserved_bytes": 126 * 2**20, "device_total_bytes": 700 * 2**20,
           "time_s": 0.012, "time_low_s": 0.008, "time_high_s": 0.02, "energy_j": 3.0}
    errors = {"allocated_fraction": error_fraction(est["allocated_bytes"], measured["allocated_bytes"]),
              "reserved_fraction": error_fraction(est["reserved_bytes"], measured["reserved_bytes"]),
              "nvml_used_fraction": error_fraction(est["device_total_bytes"], measured["nvml_used_bytes"]),
              "step_time_fraction": error_fraction(est["time_s"], measured["step_s"]),
              "energy_fraction": error_fraction(est["energy_j"], measured["energy_j"])}
    text = render_markdown({"device": "NVIDIA H100 80GB HBM3", "gpu": "H100-80GB", "driver": "550", "torch": "2.13",
                            "cuda": "12.8", "date": "2026-11-25"},
                           {"context_bytes": 500 * 2**20, "cublas_workspace_bytes": 32 * 2**20},
                           [{"model": "gpt2", "batch": 4, "measured": measured, "estimate": est, "errors": errors}])
    row = next(line for line in text.splitlines() if line.startswith("| gpt2 "))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[2:5] == ["100.0", "90.0", "-10.0%"]
    assert cells[5:8] == ["120.0", "126.0", "+5.0%"]
    assert cells[8:11] == ["n/a", "700.0", "n/a"]  # unknown stays unknown, never 0
    assert cells[13] == "+20.0%" and cells[16] == "+50.0%"
    assert "500.0 MiB" in text
