"""The fingerprint calibration's choice of runs (server/analysis/projection/calibrate.py)."""

from __future__ import annotations

import math

import pytest

from server.analysis.base.gpu_catalog import find_model
from server.analysis.projection.calibrate import FINGERPRINT_BAND_LOG_HALFWIDTH, fingerprint_calibration

H100, A100 = find_model("H100-80GB"), find_model("A100-80GB")
assert H100 is not None and A100 is not None


def _run(job_id: str, gpu: str, batch: int | None, step_s: float, *, precision: str | None = "torch.float32",
         count: int = 1, energy: float | None = None) -> dict:
    return {"job_id": job_id, "gpu_name": gpu, "batch_size": batch, "step_time_s": step_s, "precision": precision,
            "gpu_count": count, "energy_per_step_j": energy}


JOB = _run("job", "NVIDIA H100 80GB HBM3", 64, 0.2)


def test_nearest_batch_size_on_both_types_sets_the_ratio() -> None:
    runs = [_run("h32", "NVIDIA H100 80GB HBM3", 32, 0.1, energy=50.0), _run("a32", "A100-80GB", 32, 0.3, energy=90.0),
            _run("h512", "H100", 512, 1.0), _run("a512", "NVIDIA A100-SXM4-80GB", 512, 1.5),
            _run("a64", "A100-80GB", 64, 9.9)]  # the job's own batch size, but never on the H100: not a pair
    cal = fingerprint_calibration(JOB, runs, source=H100, target=A100)
    assert cal is not None and cal.batch_sizes == [32] and cal.step_time_ratio == pytest.approx(3.0)
    assert cal.energy_per_step_ratio == pytest.approx(90.0 / 50.0)
    assert cal.source_job_ids == ["h32"] and cal.target_job_ids == ["a32"]
    assert cal.band_log_halfwidth == FINGERPRINT_BAND_LOG_HALFWIDTH and "batch 32" in cal.rule


def test_equally_near_configurations_give_their_median_and_unknown_energy_stays_null() -> None:
    runs = [_run("h32", "H100", 32, 0.1), _run("a32", "A100-80GB", 32, 0.2),
            _run("h128", "H100", 128, 0.4), _run("a128a", "A100-80GB", 128, 1.0), _run("a128b", "A100-80GB", 128, 1.6)]
    cal = fingerprint_calibration(JOB, runs, source=H100, target=A100)
    assert cal is not None and cal.batch_sizes == [32, 128]
    assert cal.step_time_ratio == pytest.approx((2.0 + 1.3 / 0.4) / 2)  # median of 2.0 and 3.25
    assert cal.energy_per_step_ratio is None


@pytest.mark.parametrize("other", [
    {"precision": "torch.bfloat16"},  # another precision moves on other units
    {"count": 8},                     # another GPU count adds communication
])
def test_other_precision_or_gpu_count_does_not_calibrate(other: dict) -> None:
    runs = [_run("h32", "H100", 32, 0.1, **other), _run("a32", "A100-80GB", 32, 0.3, **other)]
    assert fingerprint_calibration(JOB, runs, source=H100, target=A100) is None


def test_unknown_batch_sizes_match_only_each_other_and_one_type_is_not_enough() -> None:
    job = _run("job", "H100", None, 0.2)
    runs = [_run("h", "H100", None, 0.1), _run("a", "A100-80GB", None, 0.25), _run("h8", "H100", 8, 0.1),
            _run("a8", "A100-80GB", 8, 0.9)]
    cal = fingerprint_calibration(job, runs, source=H100, target=A100)
    assert cal is not None and cal.batch_sizes == [None] and math.isclose(cal.step_time_ratio, 2.5)
    assert "no batch size recorded" in cal.rule
    assert fingerprint_calibration(JOB, runs[:1] + runs[2:3], source=H100, target=A100) is None  # H100 only
    assert fingerprint_calibration(JOB, runs[2:], source=H100, target=H100) is None  # same type: nothing to learn


def test_fleet_pairs_correct_the_roofline_by_the_median_miss_of_at_least_two_models() -> None:
    from server.analysis.projection.calibrate import FleetPairs
    from server.analysis.projection.inputs import measured_from_inputs
    from server.analysis.projection.project import project

    def pair(fp: str, batch: int, step_s: float, miss: float) -> list[tuple[str, dict]]:
        """A configuration on both types whose A100 step is `miss` x what the roofline projects from its H100 run."""
        src = {**_run(f"{fp}-h-{batch}", "H100", batch, step_s), "energy_per_step_j": 300.0 * step_s}
        roofline = project(measured_from_inputs(src), A100).step_time_ratio.central
        return [(fp, src), (fp, _run(f"{fp}-a-{batch}", "A100-80GB", batch, step_s * roofline * miss))]

    one = pair("m1", 32, 0.1, 1.5)
    assert FleetPairs(one).calibration(H100, A100) is None  # one model is not enough
    runs = one + pair("m1", 64, 0.2, 1.4) + pair("m2", 32, 0.3, 0.9) + [("m3", _run("m3-h", "H100", 32, 0.2))]
    cal = FleetPairs(runs).calibration(H100, A100)
    assert cal is not None and cal.source == "fleet_pairs" and cal.models == 2 and cal.pairs == 3
    assert cal.roofline_correction == pytest.approx(1.4)  # the median of 1.5, 1.4 and 0.9
    assert cal.step_time_ratio is None and cal.energy_band_log_halfwidth is None
    assert FleetPairs(runs).calibration(A100, A100) is None
