"""A user's own training step (`fleetprof estimate --local --step module:function`): traced on meta, its predicted
peak checked against a plain CPU run of the same step measured by torch.profiler; local only, never from the API.

The reference is independent of the estimator's step code: the user's factory and step called directly on CPU
(no emulation, no hooks), after one warm-up step outside the profiler so that the optimizers' state exists, as in
the steady state the estimate's second traced step stands for; its peak is the bytes alive before the profiled
step (parameters, buffers, inputs, optimizer state) plus the running maximum of the profiler's [memory] events.
The CPU allocator neither caches nor rounds, so the comparison is with `peak_requested_bytes`. Bound: 5 %, the
estimator's acceptance on CPU (tests/estimate/test_accuracy.py).
"""

from __future__ import annotations

import argparse

import pytest
import torch
from torch.profiler import ProfilerActivity, profile, record_function

from embedded import estimate as cli
from fleetprof.errors import CliError
from server.estimate.errors import InputMismatchError, UserStepError
from server.estimate.models import ResolvedModel, resolve
from server.estimate.schemas import EstimateRequest, InputSpec, ModelSpec
from server.estimate.service import estimate
from server.estimate.trace_step import StepSettings, trace_step
from server.estimate.user_step import load_user_step
from server.estimate.validation import measure_cpu_peak
from tests.server.helpers import auth

TOLERANCE = 0.05
STEPS = "tests.estimate.user_steps"


@pytest.fixture(autouse=True)
def _one_thread() -> None:
    torch.set_num_threads(1)


def _resolved(factory: str, features: int, **kwargs: int) -> ResolvedModel:
    return resolve(ModelSpec(factory=f"{STEPS}:{factory}", kwargs=kwargs), [InputSpec(shape=[features])], None, "none",
                   registered=(f"{STEPS}:{factory}",))


def _steady_cpu_peak(resolved: ResolvedModel, step_name: str, batch_size: int) -> int:
    """Peak bytes of the second (steady-state) step, the user's code run plainly on CPU (module docstring)."""
    torch.manual_seed(0)
    cpu = torch.device("cpu")
    model = resolved.build(cpu)
    model.train()
    batch = resolved.make_batch(batch_size, cpu)
    step = load_user_step(f"{STEPS}:{step_name}").make(model)
    before = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes()
              for t in [*model.parameters(), *model.buffers(), *batch.tensors()]}
    # the warm step runs under the profiler too: it does not report frees of blocks allocated before it started
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        step(*batch.args, **batch.kwargs)
        with record_function("steady step"):
            step(*batch.args, **batch.kwargs)
    events = list(prof.profiler.kineto_results.events())
    steady_ns = next(e.start_ns() for e in events if e.name() == "steady step")
    memory = sorted((e.start_ns(), i, e.nbytes()) for i, e in enumerate(events)
                    if e.name() == "[memory]" and e.device_type() == torch.autograd.DeviceType.CPU)
    running = 0
    peak = None
    for ns, _, nbytes in memory:
        running += nbytes
        if ns >= steady_ns:
            peak = running if peak is None else max(peak, running)
    assert peak is not None
    return sum(before.values()) + peak


def _steady_predicted_peak(resolved: ResolvedModel, settings: StepSettings, batch_size: int) -> int:
    """The trace's peak of live bytes within its second step (marks['step1'] on)."""
    st = trace_step(resolved, settings, batch_size)
    first = st.marks["step1"][0]
    live = 0
    peak = None
    for i, (_, nbytes) in enumerate(st.trace.events):
        live += nbytes
        if i >= first:
            peak = live if peak is None else max(peak, live)
    assert peak is not None
    return peak


CASES = [
    ("gan-two-updates", "gan", "gan_step", 128, 64),
    ("clip-grad-norm", "classifier", "clipped_step", 256, 64),
    ("custom-loss", "classifier", "custom_loss_step", 256, 64),
]


@pytest.mark.parametrize(("name", "factory", "step", "width", "batch"), CASES, ids=[c[0] for c in CASES])
def test_user_step_estimate_matches_a_plain_cpu_run(name: str, factory: str, step: str, width: int,
                                                    batch: int) -> None:
    resolved = _resolved(factory, width)
    settings = StepSettings(user_step=load_user_step(f"{STEPS}:{step}"))
    predicted = _steady_predicted_peak(resolved, settings, batch)
    measured = _steady_cpu_peak(resolved, step, batch)
    assert abs(predicted - measured) <= TOLERANCE * measured, (name, predicted, measured)


def test_gan_steps_both_optimizers_and_marks_the_first_update() -> None:
    resolved = _resolved("gan", 128)
    st = trace_step(resolved, StepSettings(user_step=load_user_step(f"{STEPS}:gan_step")), 16)
    assert [m for m in st.marks] == ["step0", "step0_optimizer", "step1", "step1_optimizer", "end"]
    # Adam state of both networks (exp_avg, exp_avg_sq: two fp32 copies of every parameter) is alive at the end
    params = sum(p.numel() for p in resolved.build(torch.device("meta")).parameters())
    assert st.trace.peak_requested_bytes() >= 4 * 4 * params


def test_autocast_cuda_in_the_user_step_is_emulated() -> None:
    """`torch.autocast("cuda", dtype=bf16)` disables itself without CUDA; the estimator emulates it, on meta and in
    the CPU reference alike: the bf16 step needs less than fp32, and the trace matches the emulated CPU run."""
    resolved = _resolved("classifier", 512, width=512)
    amp = StepSettings(user_step=load_user_step(f"{STEPS}:amp_step"))
    fp32 = StepSettings(user_step=load_user_step(f"{STEPS}:custom_loss_step"))
    predicted = trace_step(resolved, amp, 256).trace
    assert any(op.lowp for op in predicted.ops if op.kind == "matmul")  # the matmuls ran in bf16
    assert predicted.peak_requested_bytes() < trace_step(resolved, fp32, 256).trace.peak_requested_bytes()
    measured = measure_cpu_peak(resolved, amp, 256)
    assert abs(predicted.peak_requested_bytes() - measured) <= TOLERANCE * measured


def test_full_estimate_with_a_user_step_has_time_and_a_max_batch() -> None:
    request = EstimateRequest.model_validate({
        "model": {"factory": f"{STEPS}:gan"}, "inputs": [{"shape": [128]}], "batch_size": 8,
        "gpu_types": ["T4"], "target": "none"})
    result = estimate(request, registered=(f"{STEPS}:gan",), user_step=load_user_step(f"{STEPS}:gan_step"))
    t4 = result.gpus[0]
    assert t4.fits and t4.max_batch_size is not None and t4.max_batch_size > 8
    assert t4.roofline.time_per_step_s > 0 and result.flops_per_step > 0
    assert any("--step" in a for a in result.assumptions)


@pytest.mark.parametrize(("spec", "words"), [
    ("nocolon", "not of the form"),
    ("no.such.module:step", "cannot import"),
    (f"{STEPS}:missing", "has no attribute"),
])
def test_bad_step_names_are_refused(spec: str, words: str) -> None:
    with pytest.raises(UserStepError, match=words):
        load_user_step(spec)


def test_a_step_factory_that_returns_no_step_is_named() -> None:
    with pytest.raises(UserStepError, match="not a callable step"):
        trace_step(_resolved("classifier", 32), StepSettings(user_step=load_user_step(f"{STEPS}:not_a_step")), 2)
    with pytest.raises(UserStepError, match="raised AttributeError"):  # a GAN's step for a classifier
        trace_step(_resolved("classifier", 32), StepSettings(user_step=load_user_step(f"{STEPS}:gan_step")), 2)
    with pytest.raises(InputMismatchError):  # the step itself raised: 32 features into a 256-wide model
        trace_step(_resolved("classifier", 32), StepSettings(user_step=load_user_step(f"{STEPS}:clipped_step")), 2)


def _args(*extra: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    return parser.parse_args(["--factory", f"{STEPS}:gan", "--input", "128", "--batch-size", "4", "--gpu", "T4",
                              "--no-search", "--step", f"{STEPS}:gan_step", *extra])


def test_cli_step_needs_local() -> None:
    with pytest.raises(CliError, match="--local") as info:
        cli.run(_args())
    assert "\n" not in str(info.value)


def test_cli_local_step(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.run(_args("--local", "--format", "json")) == 0
    out = capsys.readouterr().out
    assert f"{STEPS}:gan" in out and f"{STEPS}:gan_step" in out


@pytest.mark.parametrize("field", ["step", "user_step", "train_step"])
def test_the_api_accepts_no_step(api, make_token, field: str) -> None:  # type: ignore[no-untyped-def]
    body = {"model": {"factory": "server.estimate.zoo:resnet_small"}, "inputs": [{"shape": [3, 32, 32]}],
            "batch_size": 2, field: f"{STEPS}:gan_step"}
    with pytest.raises(ValueError, match="Extra inputs are not permitted"):
        EstimateRequest.model_validate(body)
    r = api.post("/api/v1/estimate", json=body, headers=auth(make_token("scheduler")))
    assert r.status_code == 422 and field in r.text
