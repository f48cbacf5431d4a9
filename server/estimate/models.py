"""Resolve the model of a request and build its inputs, on any device (meta for tracing, cpu to measure).

Two sources: a factory `package.module:function` called with kwargs, imported only when the zoo has it or an
operator registered it (server.estimate.allowlist), or a Hugging Face `transformers` config (a model_type such as
"gpt2", or a dict with "model_type" and overrides). Only the config is built: no weights, no hub access
(`from_pretrained` is never called), no remote code (`auto_map` refused, `trust_remote_code=False`).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Container
from dataclasses import dataclass
from typing import Any

import torch

from server.estimate.allowlist import check_allowed
from server.estimate.errors import ModelBuildError, UnknownModelError
from server.estimate.named_code import NamedCodeError, import_callable
from server.estimate.schemas import InputSpec, ModelSpec
from server.estimate.step import Batch

_DTYPES = {
    "float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16,
    "int64": torch.int64, "int32": torch.int32, "bool": torch.bool,
}


@dataclass
class ResolvedModel:
    name: str
    build: Callable[[torch.device], torch.nn.Module]
    make_batch: Callable[[int, torch.device], Batch]
    hf: bool


def resolve(spec: ModelSpec, inputs: list[InputSpec], seq_len: int | None, target: str, *,
            registered: Collection[str] = ()) -> ResolvedModel:
    """The model of a request. `registered`: the factories an operator registered (the zoo is always allowed)."""
    if spec.factory is not None:
        return _resolve_factory(spec, inputs, target, registered)
    return _resolve_hf(spec, seq_len)


def _resolve_factory(spec: ModelSpec, inputs: list[InputSpec], target: str, registered: Collection[str]
                     ) -> ResolvedModel:
    assert spec.factory is not None
    check_allowed(spec.factory, registered)  # before any import: the request names no code of its own
    try:
        factory = import_callable(spec.factory, "factory")
    except NamedCodeError as exc:
        raise UnknownModelError(str(exc)) from exc.__cause__
    if not inputs:
        raise ModelBuildError(f"factory model {spec.factory!r} needs 'inputs' (shapes without the batch dimension)")

    def build(device: torch.device) -> torch.nn.Module:
        try:
            with device:
                model = factory(**spec.kwargs)
        except MemoryError:
            raise  # the sandbox's address-space limit: reported as such by the runner
        except Exception as exc:
            raise ModelBuildError(f"factory {spec.factory!r} raised {type(exc).__name__}: {exc}") from exc
        if not isinstance(model, torch.nn.Module):
            raise ModelBuildError(f"factory {spec.factory!r} returned {type(model).__name__}, not a torch.nn.Module")
        return _to_device(model, device)

    def make_batch(batch_size: int, device: torch.device) -> Batch:
        batch = Batch()
        for spec_in in inputs:
            tensor = _make_tensor([batch_size, *spec_in.shape], spec_in.dtype, spec_in.low, spec_in.high, device)
            if spec_in.name:
                batch.kwargs[spec_in.name] = tensor
            else:
                batch.args.append(tensor)
        return batch

    def make_batch_with_target(batch_size: int, device: torch.device) -> Batch:
        batch = make_batch(batch_size, device)
        batch.class_targets = target != "none"
        return batch

    return ResolvedModel(spec.factory, build, make_batch_with_target, hf=False)


def _to_device(model: torch.nn.Module, device: torch.device) -> torch.nn.Module:
    # built under `with device:` the tensors are there already; `.to()` on fake CPU tensors (the device: cpu trace)
    # would try to swap them, which fails for tensors the recorder holds weak references to
    if all(t.device == device for t in (*model.parameters(), *model.buffers())):
        return model
    return model.to(device)


def _make_tensor(shape: list[int], dtype: str, low: int, high: int, device: torch.device) -> torch.Tensor:
    torch_dtype = _DTYPES[dtype]
    if device.type == "meta":
        return torch.empty(shape, dtype=torch_dtype, device=device)
    if torch_dtype.is_floating_point:
        return torch.randn(shape, dtype=torch_dtype, device=device)
    return torch.randint(low, max(high, low + 1), shape, device=device).to(torch_dtype)


# --- Hugging Face ---------------------------------------------------------------------------------------

_TASK_ORDER = ("seq2seq_lm", "image_classification", "masked_lm", "causal_lm")
# config keys that would make transformers load code from the hub or a local path
_REMOTE_CODE_KEYS = frozenset({"auto_map", "trust_remote_code", "custom_pipelines"})


def _hf_config(spec: ModelSpec) -> Any:
    try:
        import transformers
    except ImportError as exc:  # pragma: no cover - install extra 'estimate'
        raise UnknownModelError("Hugging Face models need the 'transformers' package (extra 'estimate')") from exc
    raw = spec.hf_config
    if isinstance(raw, str):
        model_type, overrides = raw, {}
    else:
        assert raw is not None
        overrides = dict(raw)
        model_type = overrides.pop("model_type", None)
        if not isinstance(model_type, str):
            raise UnknownModelError("hf_config dict needs a 'model_type' (e.g. 'gpt2', 'bert', 't5', 'vit')")
        if refused := sorted(_REMOTE_CODE_KEYS & overrides.keys()):
            raise UnknownModelError(f"hf_config may not name code to load ({', '.join(refused)}): configs are data")
    try:
        return transformers.AutoConfig.for_model(model_type, **overrides)
    except ValueError as exc:
        raise UnknownModelError(f"unknown Hugging Face model_type {model_type!r}") from exc
    except Exception as exc:
        raise ModelBuildError(f"Hugging Face config {model_type!r} rejected the overrides: {exc}") from exc


def _hf_task(config: Any, wanted: str) -> str:
    from transformers.models.auto import modeling_auto as auto

    mappings: dict[str, Container[str]] = {
        "seq2seq_lm": auto.MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES,
        "image_classification": auto.MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES,
        "masked_lm": auto.MODEL_FOR_MASKED_LM_MAPPING_NAMES,
        "causal_lm": auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
    }
    if wanted != "auto":
        if wanted != "base" and config.model_type not in mappings[wanted]:
            raise UnknownModelError(f"model_type {config.model_type!r} has no {wanted} head in transformers")
        return wanted
    return next((task for task in _TASK_ORDER if config.model_type in mappings[task]), "base")


def _resolve_hf(spec: ModelSpec, seq_len: int | None) -> ResolvedModel:
    import transformers

    config = _hf_config(spec)
    task = _hf_task(config, spec.hf_task)
    if task == "seq2seq_lm":
        # labels are shifted right into decoder inputs; bare configs (T5 in transformers 5) leave these unset
        for attr in ("pad_token_id", "decoder_start_token_id"):
            if getattr(config, attr, None) is None:
                setattr(config, attr, 0)
    auto_class = {
        "seq2seq_lm": transformers.AutoModelForSeq2SeqLM,
        "image_classification": transformers.AutoModelForImageClassification,
        "masked_lm": transformers.AutoModelForMaskedLM,
        "causal_lm": transformers.AutoModelForCausalLM,
        "base": transformers.AutoModel,
    }[task]
    is_image = task == "image_classification" or hasattr(config, "image_size") and not hasattr(config, "vocab_size")
    if not is_image and seq_len is None:
        raise ModelBuildError(f"Hugging Face text model {config.model_type!r} needs 'seq_len'")
    max_pos = getattr(config, "n_positions", None) or getattr(config, "max_position_embeddings", None)
    if not is_image and max_pos and seq_len and seq_len > max_pos and config.model_type not in ("t5", "mt5"):
        from server.estimate.errors import InputMismatchError

        raise InputMismatchError(f"seq_len {seq_len} exceeds the model's {max_pos} positions")

    def build(device: torch.device) -> torch.nn.Module:
        try:
            with device:
                model = auto_class.from_config(config, attn_implementation=spec.attn_implementation,
                                               trust_remote_code=False)
        except Exception as exc:
            message = f"building {config.model_type!r} ({task}) raised {type(exc).__name__}: {exc}"
            raise ModelBuildError(message) from exc
        return _to_device(model, device)

    def make_batch(batch_size: int, device: torch.device) -> Batch:
        if is_image:
            size = config.image_size
            pixels = _make_tensor([batch_size, config.num_channels, size, size], "float32", 0, 1, device)
            labels = _make_tensor([batch_size], "int64", 0, config.num_labels, device)
            return Batch(kwargs={"pixel_values": pixels, "labels": labels})
        assert seq_len is not None
        ids = _make_tensor([batch_size, seq_len], "int64", 0, config.vocab_size, device)
        if task == "base":
            return Batch(kwargs={"input_ids": ids})
        labels = _make_tensor([batch_size, seq_len], "int64", 0, config.vocab_size, device)
        return Batch(kwargs={"input_ids": ids, "labels": labels})

    return ResolvedModel(f"hf:{config.model_type}/{task}", build, make_batch, hf=True)


def enable_checkpointing(model: torch.nn.Module, hf: bool) -> None:
    """Activation checkpointing: HF's own switch, else every block of the largest ModuleList/Sequential."""
    if hf and getattr(model, "supports_gradient_checkpointing", False):
        hf_model: Any = model  # a transformers PreTrainedModel (its switches are not torch.nn.Module's)
        enable = getattr(model, "activation_checkpointing_enable", None)  # transformers >= 5
        if enable is not None:
            enable(activation_checkpointing_kwargs={"use_reentrant": False})
        else:
            hf_model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        return
    from torch.utils.checkpoint import checkpoint

    sequences = (torch.nn.ModuleList, torch.nn.Sequential)
    containers = [m for m in model.modules() if isinstance(m, sequences) and len(m) > 1]
    if not containers:
        return
    blocks = max(containers, key=lambda m: sum(p.numel() for p in m.parameters()))
    for block in blocks:
        forward = block.forward

        def checkpointed(*args: Any, _forward: Callable = forward, **kwargs: Any) -> Any:
            return checkpoint(_forward, *args, use_reentrant=False, **kwargs)

        block.forward = checkpointed
