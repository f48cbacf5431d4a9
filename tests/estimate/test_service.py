"""The estimate end to end, in-process (the worker's side), and its errors."""

from __future__ import annotations

import pytest

from server.estimate.errors import (
    AbsurdRequestError,
    InputMismatchError,
    ModelBuildError,
    UnknownGpuError,
    UnknownModelError,
)
from server.estimate.schemas import EstimateRequest, EstimateResponse
from server.estimate.service import estimate
from server.estimate.trace_step import StepSettings
from tests.estimate.registered import REGISTERED

MLP = {"factory": "tests.estimate.factories:mlp", "kwargs": {"width": 256, "depth": 3}}


def _estimate(request: EstimateRequest) -> EstimateResponse:
    """The estimate with the test factories registered (as `fleetprof models add` would)."""
    return estimate(request, registered=REGISTERED)


def _request(**overrides: object) -> EstimateRequest:
    body = {"model": MLP, "inputs": [{"shape": [256]}], "batch_size": 32, "gpu_types": ["T4", "H100-80GB"]}
    body.update(overrides)
    return EstimateRequest.model_validate(body)


def test_estimate_fields_and_max_batch() -> None:
    result = _estimate(_request())
    assert result.parameter_count == 3 * (256 * 256 + 256) + 256 * 10 + 10
    assert result.peak_requested_bytes <= result.peak_allocated_bytes <= result.peak_reserved_bytes
    assert [g.gpu for g in result.gpus] == ["T4", "H100-80GB"]
    t4, h100 = result.gpus
    assert t4.fits and h100.fits
    assert h100.cublas_workspace_bytes > t4.cublas_workspace_bytes  # sm_90 default workspace
    assert t4.device_total_bytes == t4.peak_reserved_bytes + t4.context_bytes
    assert t4.headroom_bytes == t4.memory_total_bytes - t4.device_total_bytes
    assert t4.max_batch_size is not None and h100.max_batch_size is not None
    assert h100.max_batch_size > t4.max_batch_size > 32
    r = t4.roofline
    assert 0 < r.time_per_step_low_s <= r.time_per_step_s <= r.time_per_step_high_s
    assert 0 < r.energy_per_step_low_j <= r.energy_per_step_j <= r.energy_per_step_high_j
    assert result.flops_per_step > 0


def test_max_batch_is_the_boundary() -> None:
    """The searched batch fits on the simulated device and one more does not (checked with real traces)."""
    from server.analysis.base.gpu_catalog import find_model
    from server.estimate.calibration import calibration_for
    from server.estimate.models import resolve
    from server.estimate.service import _Estimator

    request = _request(gpu_types=["T4"])
    t4 = _estimate(request).gpus[0]
    assert t4.max_batch_size_exact and t4.max_batch_size is not None
    gpu = find_model("T4")
    assert gpu is not None
    cal = calibration_for(gpu)
    resolved = resolve(request.model, request.inputs, None, "auto", registered=REGISTERED)
    est = _Estimator(resolved, StepSettings())  # no affine model
    capacity = gpu.memory_bytes - cal.context_bytes
    assert est.replay(t4.max_batch_size, cal.cublas_workspace_bytes, capacity).fits
    assert not est.replay(t4.max_batch_size + 1, cal.cublas_workspace_bytes, capacity).fits


def test_does_not_fit_reports_negative_headroom() -> None:
    result = _estimate(_request(model={**MLP, "kwargs": {"width": 16384, "depth": 6}}, inputs=[{"shape": [16384]}],
                                gpu_types=["T4"], search_max_batch=False))
    t4 = result.gpus[0]
    assert not t4.fits and t4.headroom_bytes < 0 and t4.max_batch_size is None


@pytest.mark.parametrize(
    ("overrides", "error", "words"),
    [
        ({"model": {"factory": "no_such_module_xyz:make"}}, UnknownModelError, "no_such_module_xyz"),
        ({"model": {"factory": "tests.estimate.factories:nope"}}, UnknownModelError, "nope"),
        ({"model": {"factory": "tests.estimate.factories:raising"}}, ModelBuildError, "weights file missing"),
        ({"model": {"factory": "tests.estimate.factories:not_a_module"}}, ModelBuildError, "not a torch.nn.Module"),
        ({"model": {"hf_config": "no_such_arch"}, "seq_len": 8}, UnknownModelError, "no_such_arch"),
        ({"inputs": [{"shape": [100]}]}, InputMismatchError, "batch size 32"),
        ({"batch_size": 100_000_000}, AbsurdRequestError, "batch_size"),
        ({"inputs": [{"shape": [10**9, 10**6]}]}, AbsurdRequestError, "PB"),
        ({"gpu_types": ["GTX 480"]}, UnknownGpuError, "GTX 480"),
    ],
)
def test_bad_requests_name_the_problem(overrides: dict, error: type, words: str) -> None:
    with pytest.raises(error, match=words):
        _estimate(_request(**overrides))


def test_absurd_memory_from_the_trace() -> None:
    """Small inputs, but 2^25 x 2^25 weights (4.5 PB in fp32): caught after the (meta, free) trace."""
    with pytest.raises(AbsurdRequestError, match="PB"):
        _estimate(_request(model={**MLP, "kwargs": {"width": 1 << 25, "depth": 1}}, inputs=[{"shape": [1 << 25]}],
                           batch_size=1, search_max_batch=False))


def test_unregistered_factory_is_refused_before_import() -> None:
    """The worker's own check (the API checks first): a factory neither in the zoo nor registered is not imported."""
    import sys

    sys.modules.pop("tests.estimate.factories", None)
    with pytest.raises(UnknownModelError, match="not registered"):
        estimate(_request())  # registered=(): the zoo only
    assert "tests.estimate.factories" not in sys.modules


def test_hf_config_names_no_code() -> None:
    remote = {"model_type": "gpt2", "auto_map": {"AutoModelForCausalLM": "evil/repo--modeling.Model"}}
    with pytest.raises(UnknownModelError, match="auto_map"):
        estimate(_request(model={"hf_config": remote}, seq_len=8))
