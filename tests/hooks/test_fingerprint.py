"""The fingerprint rule (fleetprof/fingerprint.py) over real PyTorch modules, as the hooks send it from unmodified
scripts and as the estimator computes it for the same model: one id per model and optimizer, whatever the batch
size, precision or wrapper; another id for another architecture, width or optimizer."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from agent.hooks.fingerprint import ModelFingerprint
from agent.hooks.framework_info import FrameworkInfo
from fleetprof.fingerprint import describe_module, fingerprint_id, precision_of, tree_hash
from fleetprof.protocol import EventBatch
from server.estimate.schemas import EstimateRequest
from server.estimate.service import estimate
from server.estimate.zoo import resnet_small
from tests.hooks.conftest import Recorder, run_script


def _mlp(width: int) -> nn.Module:
    return nn.Sequential(nn.Linear(32, width), nn.ReLU(), nn.Linear(width, 10))


def _fp(model: nn.Module, optimizers: list[str] = ["SGD"]) -> str:  # noqa: B006 (read only)
    return fingerprint_id(tree_hash(describe_module(model)), optimizers)


def test_same_architecture_at_other_widths_differs() -> None:
    assert _fp(_mlp(64)) != _fp(_mlp(128))
    assert _fp(resnet_small(width=16)) != _fp(resnet_small(width=32))
    assert _fp(_mlp(64)) == _fp(_mlp(64))  # a fresh instance: the same


def test_other_types_with_the_same_shapes_differ() -> None:
    relu = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 10))
    gelu = nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 10))
    assert _fp(relu) != _fp(gelu)


def test_optimizer_is_part_of_the_id_in_any_order() -> None:
    m = _mlp(64)
    assert _fp(m, ["SGD"]) != _fp(m, ["AdamW"]) != _fp(m, [])
    assert _fp(m, ["Adam", "SGD"]) == _fp(m, ["SGD", "Adam", "SGD"])


def test_precision_wrappers_and_device_do_not_change_the_id() -> None:
    m = resnet_small()
    fp32 = _fp(m)
    assert _fp(nn.DataParallel(m)) == fp32
    assert _fp(torch.compile(m)) == fp32  # OptimizedModule: unwrapped, not compiled (nothing runs)
    with torch.device("meta"):
        assert _fp(resnet_small()) == fp32  # what the estimator builds
    assert _fp(m.to(torch.bfloat16)) == fp32


def test_tied_weights_count_once() -> None:
    emb = nn.Embedding(100, 16)
    head = nn.Linear(16, 100, bias=False)
    head.weight = emb.weight
    model = nn.Sequential(emb, head)
    assert describe_module(model).parameter_count == 1600 == sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize(("autocast", "params", "expected"), [
    (None, "float32", "fp32"), (None, "torch.bfloat16", "bf16"), (None, "float16", "fp16"),
    ("bfloat16", "float32", "amp_bf16"), ("torch.float16", "float32", "amp_fp16"), (None, None, None),
    (None, "int8", "other")])
def test_precision_of(autocast: str | None, params: str | None, expected: str | None) -> None:
    assert precision_of(autocast_dtype=autocast, parameter_dtype=params) == expected


def test_framework_info_id_ignores_batch_size_and_autocast() -> None:
    """The hooks' collaborator fed as the Profiler feeds it: other batch sizes and autocast, one id."""
    def info(batch: int, autocast: bool) -> dict:
        fi = FrameworkInfo(torch)
        model = _mlp(64)
        fi.note_model(model)
        fi.note_optimizer(torch.optim.SGD(model.parameters(), lr=0.1))
        fi.note_step_samples(batch)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            fi.note_forward()
        return fi.info(cuda=False)

    small, large, amp = info(8, False), info(64, False), info(8, True)
    assert small["fingerprint"] == large["fingerprint"] == amp["fingerprint"]
    assert (small["batch_size"], large["batch_size"]) == (8, 64)
    assert (small["precision_mode"], amp["precision_mode"]) == ("fp32", "amp_bf16")
    assert small["framework"] == "pytorch" and small["framework_version"] == torch.__version__
    assert small["module_count"] == 4


def _hooks_info(recorder: Recorder, *args: str) -> dict:
    recorder.bodies.clear()
    run = run_script("train_zoo.py", *args, server_url=recorder.url)
    assert run.returncode == 0, run.stderr
    for body in recorder.bodies:
        EventBatch.model_validate(body)
    infos = recorder.events("framework_info")
    assert infos, recorder.bodies
    return infos[-1]


@pytest.mark.parametrize(("factory", "optimizer", "estimate_optimizer"), [
    ("resnet_small", "sgd", "sgd_momentum"), ("vgg_small", "adamw", "adamw")])
def test_estimator_and_hooks_agree_on_a_zoo_model(recorder: Recorder, factory: str, optimizer: str,
                                                  estimate_optimizer: str) -> None:
    """The estimator's fingerprint of a zoo model equals what the hooks send from a real training run of it (at
    another batch size, wrapped in DataParallel or not); another zoo model or optimizer does not match."""
    est = estimate(EstimateRequest.model_validate({
        "model": {"factory": f"server.estimate.zoo:{factory}"}, "inputs": [{"shape": [3, 32, 32]}],
        "batch_size": 2, "device": "cpu", "optimizer": estimate_optimizer, "search_max_batch": False}))
    assert est.fingerprint is not None and est.fingerprint.source == "estimate"
    hooks = _hooks_info(recorder, factory, optimizer, "6")
    assert hooks["fingerprint"] == est.fingerprint.fingerprint
    assert hooks["module_tree_hash"] == est.fingerprint.module_tree_hash
    assert hooks["parameter_count"] == est.fingerprint.parameter_count == est.parameter_count
    assert hooks["model_class"] == est.fingerprint.model_class
    wrapped = _hooks_info(recorder, factory, optimizer, "4", "--wrapped")
    assert wrapped["fingerprint"] == est.fingerprint.fingerprint and wrapped["batch_size"] == 4
    other = "vgg_small" if factory == "resnet_small" else "resnet_small"
    assert _hooks_info(recorder, other, optimizer, "6")["fingerprint"] != est.fingerprint.fingerprint
    other_opt = "adamw" if optimizer == "sgd" else "sgd"
    assert _hooks_info(recorder, factory, other_opt, "6")["fingerprint"] != est.fingerprint.fingerprint


def test_model_fingerprint_of_fields() -> None:
    mf = ModelFingerprint.of(torch, _mlp(64))
    f = mf.fields(optimizers=["SGD"], autocast_dtype=None, parameter_dtype="float32")
    assert f["fingerprint"] == _fp(_mlp(64)) and len(f["module_tree_hash"]) == 64


def test_estimator_goes_on_without_a_fingerprint_for_an_undescribable_module() -> None:
    from server.estimate.fingerprint import estimate_fingerprint

    lazy = nn.Sequential(nn.LazyLinear(4))  # its weight has no shape before a forward
    assert estimate_fingerprint(lazy, optimizer="sgd", precision="fp32", batch_size=2) is None
    lazy(torch.randn(2, 3))
    section = estimate_fingerprint(lazy, optimizer="sgd", precision="fp32", batch_size=2)
    assert section is not None and section.fingerprint == _fp(lazy, ["SGD"])
    assert estimate_fingerprint(lazy, optimizer=None, precision="fp32", batch_size=2).fingerprint is None


def test_attention_implementation_classes_read_as_the_plain_one() -> None:
    """transformers 4.36-4.47 built LlamaSdpaAttention or LlamaFlashAttention2 by attn_implementation: the same
    model's runs at another attention kernel (or transformers version) share the fingerprint."""
    def model_with(attention: type) -> nn.Module:
        return nn.Sequential(attention())

    names = ("LlamaAttention", "LlamaSdpaAttention", "LlamaFlashAttention2")
    kinds = [type(n, (nn.Module,), {"__init__": lambda self: (nn.Module.__init__(self), setattr(
        self, "q_proj", nn.Linear(8, 8)))[0]}) for n in names]
    assert len({_fp(model_with(k)) for k in kinds}) == 1
    self_attn = [type(n, (nn.Linear,), {}) for n in ("BertSelfAttention", "BertSdpaSelfAttention")]
    assert _fp(nn.Sequential(self_attn[0](4, 4))) == _fp(nn.Sequential(self_attn[1](4, 4)))
    assert _fp(nn.Sequential(kinds[0]())) != _fp(nn.Sequential(type("LlamaMLP", (kinds[0],), {})()))
