"""Fit advice for jobs near or past capacity: checkpointing, AMP bf16, the largest batch, each with numbers."""

from __future__ import annotations

from typing import Any

import pytest

from fleetprof.report import Recommendation
from server.analysis.fleet.batch_sizing import BatchFit
from server.analysis.planning.fit_advice import (
    AmpEstimate,
    amp_bf16_saving,
    checkpoint_plan,
    fit_recommendations,
    largest_batch,
    near_capacity,
)

GiB = 1 << 30
MiB = 1 << 20


def _layer(module: str, parent: str | None, act: int | None, fwd: float | None) -> dict[str, Any]:
    return {"module": module, "parent": parent, "activation_bytes": act, "forward_s": fwd}


LAYERS = [
    _layer("model", None, 10 * GiB, 0.100),
    _layer("model.encoder", "model", 6 * GiB, 0.060),
    _layer("model.encoder.block0", "model.encoder", 3 * GiB, 0.020),  # 150 GiB/s
    _layer("model.encoder.block1", "model.encoder", 3 * GiB, 0.030),  # 100 GiB/s
    _layer("model.head", "model", 1 * GiB, 0.001),  # 1000 GiB/s: taken first
    _layer("model.norm", "model", None, 0.001),  # no activation figure: never taken
]


def test_near_capacity() -> None:
    assert near_capacity(96 * GiB, 100 * GiB, False) and not near_capacity(94 * GiB, 100 * GiB, False)
    assert near_capacity(None, None, True)  # an OOM is near capacity whatever the figures


def test_checkpoint_plan_takes_best_bytes_per_second_never_nested() -> None:
    plan = checkpoint_plan(LAYERS, need_bytes=4 * GiB)
    # head (1 GiB, 1 ms), then block0 (3 GiB, 20 ms): 4 GiB met; encoder (which holds block0) is not taken
    assert [c.module for c in plan] == ["model.head", "model.encoder.block0"]
    assert sum(c.saved_bytes for c in plan) == 4 * GiB
    assert sum(c.recompute_s for c in plan) == pytest.approx(0.021)
    more = checkpoint_plan(LAYERS, need_bytes=20 * GiB)  # cannot be met: everything not nested, never the root
    assert {c.module for c in more} == {"model.head", "model.encoder.block0", "model.encoder.block1"}


def test_amp_saving_from_estimator_else_activation_share() -> None:
    assert amp_bf16_saving(8 * GiB, 2 * GiB, AmpEstimate(30 * GiB, 22 * GiB))[0] == 8 * GiB
    assert amp_bf16_saving(8 * GiB, 2 * GiB, None)[0] == 3 * GiB  # 4 GiB of activations less 1 GiB of bf16 copies
    assert amp_bf16_saving(8 * GiB, None, None)[0] == 4 * GiB
    assert amp_bf16_saving(None, None, None) is None


def test_largest_batch_from_fit_or_activation_share() -> None:
    # memory = 20 GiB + 1 GiB x batch, 80 GiB with 5 % free: 76 GiB -> 56
    fit = BatchFit(fixed_bytes=20 * GiB, per_sample_bytes=1 * GiB, r2=1.0, runs=3)
    assert largest_batch(79 * GiB, 80 * GiB, 32, None, fit) == (56, fit, "memory-vs-batch fit over 3 runs")
    # one run: 78 GiB peak at batch 64 with 48 GiB activations: 30 GiB fixed + 0.75 GiB/sample -> 46 / 0.75
    result = largest_batch(78 * GiB, 80 * GiB, 64, 48 * GiB, None)
    assert result is not None and result[0] == 61 and result[1].fixed_bytes == 30 * GiB
    assert largest_batch(78 * GiB, 80 * GiB, None, 48 * GiB, None) is None
    # 1 GiB of activations at 78 GiB: 77 GiB does not scale, more than 95 % of 80 GiB
    result = largest_batch(78 * GiB, 80 * GiB, 64, 1 * GiB, None)
    assert result is not None and result[0] is None


def _report(peak: int, oom: bool) -> dict[str, Any]:
    return {"batch_size": 64,
            "memory": {"memory_total_bytes": 80 * GiB, "peak_reserved_bytes": peak, "oom_detected": oom},
            "time": {"layers": LAYERS},
            "optimization": {"memory_breakdown": {"activations": {"bytes": 48 * GiB}, "weights": {"bytes": 4 * GiB}}}}


def _fit(report: dict[str, Any]) -> list[dict[str, Any]]:
    """The recommendations as the report stores them (JSON)."""
    return [r.model_dump(mode="json") for r in fit_recommendations(report)]


def test_fit_recommendations_for_a_job_near_capacity() -> None:
    recs = _fit(_report(78 * GiB, False))
    assert [r["kind"] for r in recs] == ["activation_checkpointing", "amp_bf16", "batch_size_fit"]
    for r in recs:
        Recommendation.model_validate(r)
    ckpt, amp, batch = recs
    assert ckpt["evidence"]["need_bytes"] == 2 * GiB  # 78 - 0.95 x 80
    assert ckpt["saving"]["bytes"] >= 2 * GiB and ckpt["evidence"]["meets_need"]
    assert ckpt["saving"]["extra_step_s"] == pytest.approx(0.021)
    assert amp["saving"]["bytes"] == 22 * GiB  # 24 GiB of activations less 2 GiB of bf16 weight copies
    assert batch["evidence"]["largest_batch"] == 61
    assert amp["evidence"]["activations_source"] == "activations"


def test_measured_step_allocations_stand_in_for_activations_and_say_so() -> None:
    report = _report(78 * GiB, False)
    report["optimization"]["memory_breakdown"] = {"activations": {"bytes": None},
                                                  "step_allocations": {"bytes": 40 * GiB}}
    [_, amp, _] = _fit(report)
    assert amp["saving"]["bytes"] == 20 * GiB and "step allocations" in amp["reason"]


def test_no_fit_advice_with_room_and_at_least_after_an_oom() -> None:
    assert _fit(_report(60 * GiB, False)) == []
    recs = _fit(_report(80 * GiB, True))
    assert "ran out of memory" in recs[0]["reason"] and "at least 4.00 GiB" in recs[0]["reason"]
    assert "upper bound" in recs[-1]["reason"]
