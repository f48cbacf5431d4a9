from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from server.analysis.base.gpu_catalog import load_catalog
from server.analysis.fleet.batch_sizing import fit_batch_memory, max_batch_size
from server.analysis.fleet.rightsizing import (
    SAFETY_MARGIN_FRACTION,
    power_cap_choice,
    rightsize,
    smallest_fitting_gpu,
    vpa_memory_target,
)

from .realdata import MIB, query_gpu_row, zeus_windows

GIB = 2**30


def test_power_cap_matches_independent_choice_on_zeus_epochs(real_data):
    """Per (model, batch size, optimizer) on each GPU: energy per epoch = average power × time; our cap is
    the least-energy cap within 10% of the fastest, computed here independently with pandas."""
    checked = 0
    for path in sorted((real_data / "energy/zeus-nsdi23").glob("summary_power_*.csv")):
        df = pd.read_csv(path)
        df["energy_j"] = df.average_power * df.time_per_epoch
        for _, g in df.groupby(["dataset", "network", "batch_size", "optimizer"]):
            if g.power_limit.nunique() < 2:
                continue
            ok = g[g.time_per_epoch <= 1.1 * g.time_per_epoch.min()]
            expected = ok.loc[ok.energy_j.idxmin(), "power_limit"]
            got = power_cap_choice(list(zip(g.power_limit, g.energy_j, g.time_per_epoch)))
            assert got["power_limit_w"] == expected
            assert got["baseline_power_limit_w"] == g.power_limit.max()
            assert got["energy_saving_fraction"] >= 0 or got["power_limit_w"] == g.power_limit.max()
            checked += 1
    assert checked > 100


def test_power_cap_on_zeus_nvml_windows(real_data):
    for path in sorted((real_data / "energy/zeus-profile-data").glob("*.csv")):
        wins = zeus_windows(path)
        got = power_cap_choice([(w["power_limit_w"], w["gpu0_energy"], w["elapsed_time"]) for w in wins])
        fastest = min(w["elapsed_time"] for w in wins)
        allowed = [w for w in wins if w["elapsed_time"] <= 1.1 * fastest]
        assert got["power_limit_w"] == min(allowed, key=lambda w: w["gpu0_energy"])["power_limit_w"]
    assert power_cap_choice([(300.0, 100.0, 1.0)]) is None  # one cap: needs measuring


def test_smallest_fitting_gpu_for_real_peak(real_data):
    q = query_gpu_row(real_data / "nvidia-smi/linux-x86_64__nvidia-h100-80gb-hbm3__590.48.01.txt", "load")
    peak = float(q["memory.used [MiB]"].split()[0]) * MIB
    t = vpa_memory_target([peak], history_s=3600.0)
    assert t.target_bytes == math.ceil(peak * (1 + SAFETY_MARGIN_FRACTION))
    fit = smallest_fitting_gpu(t.target_bytes)
    cat = sorted(load_catalog(), key=lambda m: m.memory_bytes)
    assert fit == next(m for m in cat if m.memory_bytes >= t.target_bytes)
    assert smallest_fitting_gpu(10**15) is None


def test_vpa_bounds_narrow_with_history_and_bump_after_oom():
    rng = np.random.default_rng(0)
    peaks = list(20 * GIB + rng.normal(0, GIB, 48))
    short = vpa_memory_target(peaks, history_s=2 * 3600)
    long = vpa_memory_target(peaks, history_s=30 * 86400)
    assert short.target_bytes == long.target_bytes >= max(peaks)
    assert short.upper_bound_bytes > long.upper_bound_bytes > long.target_bytes
    assert short.lower_bound_bytes <= long.lower_bound_bytes <= long.target_bytes
    oom = vpa_memory_target(peaks, history_s=3600, oom=True, oom_capacity_bytes=24 * GIB)
    assert oom.target_bytes >= 24 * GIB * 1.2 and oom.oom_bump
    assert vpa_memory_target([], history_s=1.0) is None


def test_batch_fit_recovers_line_and_needs_two_sizes():
    a, b = 3 * GIB, 90 * MIB
    runs = [(bs, a + b * bs + noise) for bs, noise in [(16, 5e6), (32, -3e6), (64, 2e6), (128, -1e6)]]
    fit = fit_batch_memory(runs)
    assert fit.per_sample_bytes == pytest.approx(b, rel=0.01)
    assert fit.fixed_bytes == pytest.approx(a, rel=0.01)
    best = max_batch_size(fit, 24 * GIB)
    assert fit.fixed_bytes + fit.per_sample_bytes * best <= 24 * GIB * (1 - SAFETY_MARGIN_FRACTION)
    assert fit.fixed_bytes + fit.per_sample_bytes * (best + 1) > 24 * GIB * (1 - SAFETY_MARGIN_FRACTION)
    assert fit_batch_memory([(32, 1e9), (32, 1.1e9)]) is None


def test_rightsize_history_every_recommendation_has_reason_evidence_saving():
    base = {"gpu_name": "NVIDIA H100 80GB HBM3", "gpu_count": 8, "memory_total_bytes": 85520809984,
            "duration_s": 7200.0, "oom": False, "gpu_util_mean_pct": 20.0, "step_time_s": 0.5,
            "energy_per_step_j": 900.0, "power_limit_w": None}
    history = [{**base, "batch_size": bs, "peak_used_bytes": 4 * GIB + bs * 100 * MIB,
                "peak_reserved_bytes": 3 * GIB + bs * 100 * MIB,
                "interval_peaks_bytes": [4 * GIB + bs * 100 * MIB]} for bs in (16, 32, 64)]
    out = rightsize(history)
    kinds = {r.kind for r in out["recommendations"]}
    assert {"gpu_type", "gpu_count", "batch_size", "power_cap"} <= kinds
    for r in out["recommendations"]:
        assert r.reason and r.summary
    count = next(r for r in out["recommendations"] if r.kind == "gpu_count")
    assert count.evidence["gpu_count"] == 8 and count.saving and count.saving["gpus"] == 8 - 3  # ceil(8·20/70) = 3
    cap = next(r for r in out["recommendations"] if r.kind == "power_cap")
    assert cap.summary == "Power cap needs measuring" and cap.saving is None
    assert out["memory"]["observed_peak_bytes"] == 4 * GIB + 64 * 100 * MIB


def test_upper_bound_on_a_short_history_stays_within_the_gpu():
    """10 minutes on an 80 GB GPU widened the upper bound by 1 + 1/confidence_days = x145: ~9 TB. It is now the
    GPU's memory at most (a run that did not run out of memory needed no more), and the confidence is said."""
    from server.analysis.fleet.rightsizing import rightsize

    capacity = 81559 * 2**20  # H100 80GB as NVML reports it
    run = {"job_id": "short", "gpu_name": "NVIDIA H100 80GB HBM3", "gpu_count": 1, "memory_total_bytes": capacity,
           "peak_used_bytes": 60 * GIB, "interval_peaks_bytes": [60 * GIB], "duration_s": 600.0, "oom": False}
    mem = rightsize([run])["memory"]
    assert mem["target_bytes"] == math.ceil(60 * GIB * 1.15) <= mem["upper_bound_bytes"] == capacity
    assert mem["upper_bound_capped_at"] == "gpu_capacity"
    assert mem["confidence"] == "low" and mem["history_s"] == 600.0
    unknown_gpu = rightsize([{**run, "memory_total_bytes": None}])["memory"]  # the largest catalogue GPU bounds it
    assert unknown_gpu["upper_bound_capped_at"] == "largest_catalogue_gpu"
    assert unknown_gpu["upper_bound_bytes"] == max(m.memory_bytes for m in load_catalog())
    month = rightsize([{**run, "duration_s": 30 * 86400.0}])["memory"]  # long history: VPA's own bound, tighter
    assert month["confidence"] == "high" and month["upper_bound_capped_at"] is None
    assert mem["target_bytes"] < month["upper_bound_bytes"] < capacity
    oom = rightsize([{**run, "oom": True}])["memory"]  # after an OOM it may (must) exceed what the GPU had
    assert oom["upper_bound_bytes"] >= oom["target_bytes"] >= capacity * 1.2
