"""bench/projection.py's core on a small subset of the real tables: Zeus' resnet50 rows and the HTA trace pair."""

from __future__ import annotations

import pytest

from bench.projection import DATA, project_pairs, summarize, trace_runs, zeus_runs


def test_zeus_resnet50_pairs_are_projected_and_scored() -> None:
    runs = zeus_runs(DATA / "energy" / "zeus-nsdi23", networks=["resnet50"])
    assert {m.run.gpu.name for m in runs} == {"V100-PCIE-32GB", "A40", "RTX6000", "P100-PCIE-16GB"}
    results = project_pairs(runs)
    assert results and all(r.source != r.target for r in results)
    # every pair compares the same workload, measured on both GPUs
    assert all(r.workload.startswith("imagenet/resnet50/") for r in results)
    s = summarize(results)
    assert s["pairs_count"] == len(results)
    assert 0 <= s["time_band_coverage_pct"] <= 100 and s["median_time_error_pct"] >= 0
    assert s["median_energy_error_pct"] is not None
    identity = project_pairs(runs[:3], include_identity=True)
    assert all(r.time_error == pytest.approx(0.0) and r.covered for r in identity if r.source == r.target)


def test_trace_pair_cross_projections_land_in_their_bands() -> None:
    runs = trace_runs()
    # the split of compute time comes from the traces' kernel names (an unknown split would start the range at 0)
    assert all(0 < m.run.shares.compute_bound_low < m.run.shares.compute_bound for m in runs)
    results = [r for r in project_pairs(runs) if r.source != r.target]
    assert {(r.source, r.target) for r in results} == {("A100-40GB", "V100-16GB"), ("V100-16GB", "A100-40GB")}
    assert all(r.covered for r in results)
    assert all(abs(r.time_error) < 0.2 for r in results)
    assert summarize([])["median_time_error_pct"] is None


def test_frozen_telemetry_constants_are_the_fit_and_folds_never_see_their_model() -> None:
    from bench.projection import PRODUCT_FIT_MODELS, frozen_check, leave_one_model_out

    runs = zeus_runs(DATA / "energy" / "zeus-nsdi23")
    check = frozen_check(runs)
    assert check["frozen_matches_fit_ok"], check["fitted"]  # a constant changed by hand fails here
    assert {m.network for m in runs} == PRODUCT_FIT_MODELS
    lomo = leave_one_model_out([m for m in runs if m.network in {"resnet50", "shufflenetv2", "ncf"}])
    for held, f in lomo["per_held_out_model"].items():
        assert held not in f["fit_models"] and len(f["fit_models"]) == 2
        assert f["band_log_halfwidth_ratio"] > 0
    assert lomo["pooled_held_out"]["pairs_count"] == sum(f["held_out"]["pairs_count"]
                                                         for f in lomo["per_held_out_model"].values())
