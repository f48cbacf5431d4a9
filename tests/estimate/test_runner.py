"""`run_estimate`: the estimate in a child process, with a time limit and errors carried back."""

from __future__ import annotations

import sys
import time

import pytest

from server.estimate import EstimateError, run_estimate
from server.estimate.errors import EstimateTimeoutError, ModelBuildError
from tests.estimate.registered import REGISTERED

REQUEST = {
    "model": {"factory": "tests.estimate.factories:mlp", "kwargs": {"width": 64}},
    "inputs": [{"shape": [64]}], "batch_size": 16, "gpu_types": ["A100-80GB"],
}


def test_runs_in_a_child_process() -> None:
    before = set(sys.modules)
    result = run_estimate(REQUEST, timeout_s=120, registered=REGISTERED)
    assert result["gpus"][0]["gpu"] == "A100-80GB" and result["gpus"][0]["fits"]
    assert "torch" not in set(sys.modules) - before or "torch" in before  # nothing heavy imported here


def test_errors_cross_the_process_boundary() -> None:
    bad = {**REQUEST, "model": {"factory": "tests.estimate.factories:raising"}}
    with pytest.raises(ModelBuildError, match="weights file missing"):
        run_estimate(bad, timeout_s=120, registered=REGISTERED)


def test_invalid_request_is_refused_before_starting() -> None:
    with pytest.raises(EstimateError, match="invalid estimate request"):
        run_estimate({**REQUEST, "batch_size": 0})


@pytest.mark.slow
def test_hung_factory_is_killed_at_the_limit() -> None:
    hung = {**REQUEST, "model": {"factory": "tests.estimate.factories:sleeping"}}
    started = time.monotonic()
    with pytest.raises(EstimateTimeoutError, match="did not finish within 20 s"):
        run_estimate(hung, timeout_s=20, registered=REGISTERED)
    assert time.monotonic() - started < 30
