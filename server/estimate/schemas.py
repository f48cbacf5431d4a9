"""Request and response of the pre-training estimate (`POST /api/v1/estimate`)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from fleetprof.report import FingerprintSection, MemoryBreakdown

MAX_BATCH_SIZE = 10_000_000  # beyond this a request is refused as absurd, not traced

Optimizer = Literal["sgd", "sgd_momentum", "adam", "adamw", "adagrad", "rmsprop"]
Precision = Literal["fp32", "amp_fp16", "amp_bf16"]
InputDtype = Literal["float32", "float16", "bfloat16", "int64", "int32", "bool"]


class ModelSpec(BaseModel):
    """Either an importable factory (`module:function` + kwargs) or a Hugging Face config (name or dict)."""

    model_config = ConfigDict(extra="forbid")

    factory: str | None = Field(None, description="'package.module:function' returning an nn.Module")
    kwargs: dict[str, Any] = Field(default_factory=dict, description="keyword arguments for the factory")
    hf_config: str | dict[str, Any] | None = Field(
        None, description="a transformers model_type ('gpt2') or a config dict with 'model_type'"
    )
    hf_task: Literal["auto", "causal_lm", "masked_lm", "seq2seq_lm", "image_classification", "base"] = "auto"
    attn_implementation: Literal["sdpa", "eager"] = "sdpa"

    @model_validator(mode="after")
    def _one_source(self) -> ModelSpec:
        if (self.factory is None) == (self.hf_config is None):
            raise ValueError("give exactly one of 'factory' or 'hf_config'")
        return self


class InputSpec(BaseModel):
    """One model input; `shape` excludes the batch dimension. Integer inputs are drawn in [low, high)."""

    model_config = ConfigDict(extra="forbid")

    name: str | None = Field(None, description="keyword name; positional when omitted")
    shape: list[int]
    dtype: InputDtype = "float32"
    low: int = 0
    high: int = 2


class EstimateRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: ModelSpec
    inputs: list[InputSpec] = Field(
        default_factory=list, description="for factory models; HF models derive inputs from seq_len / config"
    )
    seq_len: int | None = Field(None, ge=1, le=1_000_000, description="token sequence length for HF text models")
    target: Literal["auto", "class_index", "none"] = Field(
        "auto", description="loss: HF models use their own labels; tensors (N, C) get cross-entropy, else mean()"
    )
    batch_size: int = Field(..., ge=1, description="per micro-batch, per GPU")
    optimizer: Optimizer = "adamw"
    optimizer_impl: Literal["foreach", "for_loop"] | None = Field(
        None, description="null: PyTorch's default for the device (foreach on CUDA, with extra transient lists during "
        "step(); for_loop on CPU)"
    )
    device: Literal["cuda", "cpu"] = Field(
        "cuda", description="the device the job trains on: 'cuda' (per GPU type: caching allocator, cuBLAS workspace, "
        "fused attention, foreach optimizers) or 'cpu' (a plain CPU loop: CPU kernels, no caching, no rounding; "
        "validated op for op against torch.profiler, see docs/estimator.md)"
    )
    precision: Precision = "fp32"
    grad_accumulation: int = Field(1, ge=1, le=100_000)
    activation_checkpointing: bool = False
    gpu_types: list[str] | None = Field(None, description="catalogue names; default: the whole catalogue")
    search_max_batch: bool = True

    @model_validator(mode="after")
    def _sane(self) -> EstimateRequest:
        if self.gpu_types is not None and not self.gpu_types:
            raise ValueError("gpu_types must not be empty (omit it for the whole catalogue)")
        return self


class RooflineEstimate(BaseModel):
    time_per_step_s: float
    time_per_step_low_s: float
    time_per_step_high_s: float
    compute_bound_fraction: float = Field(description="share of the GPU's busy time in compute-bound kernels")
    energy_per_step_j: float
    energy_per_step_low_j: float
    energy_per_step_high_j: float
    gpu_busy_s: float | None = Field(None, description="the GPU's busy time per step (central): the roofline")
    host_issue_s: float | None = Field(
        None, description="the host's time to issue the step's ops in eager mode (central): traced ops x the "
                          "host's cost per op")
    host_bound: bool | None = Field(None, description="the host issues ops slower than the GPU runs them: the "
                                                      "step's time is the host's (a larger batch is nearly free)")


class GpuFit(BaseModel):
    gpu: str
    memory_total_bytes: int
    context_bytes: int = Field(description="CUDA context and library code, outside the allocator (calibration)")
    cublas_workspace_bytes: int = Field(description="inside the allocator: included in allocated/reserved")
    peak_allocated_bytes: int
    peak_reserved_bytes: int
    device_total_bytes: int = Field(description="peak reserved + CUDA context: what NVML would show")
    fits: bool
    headroom_bytes: int = Field(description="memory_total - device_total (negative when it does not fit)")
    max_batch_size: int | None = Field(description="largest micro-batch that fits; null when not searched")
    max_batch_size_exact: bool = Field(description="false when the search hit its time bound (lower bound)")
    roofline: RooflineEstimate
    calibration_source: str
    breakdown: MemoryBreakdown | None = Field(
        None, description="device memory at the peak by what holds it; adds up to device_total_bytes")


class EstimateResponse(BaseModel):
    model_name: str
    device: Literal["cuda", "cpu"] = Field("cuda", description="the device estimated for (the request's)")
    parameter_count: int
    parameter_bytes: int
    batch_size: int
    precision: Precision
    optimizer: Optimizer
    peak_requested_bytes: int = Field(description="sum of live tensor sizes at the peak, unrounded")
    peak_allocated_bytes: int = Field(
        description="caching allocator, rounded blocks (max_memory_allocated), tensors only; per GPU adds cuBLAS. "
        "device cpu: the CPU allocator neither rounds nor caches, so it equals peak_requested_bytes"
    )
    peak_reserved_bytes: int = Field(description="caching allocator segments (max_memory_reserved), tensors only; "
                                     "device cpu: equals peak_requested_bytes")
    allocations: int
    flops_per_step: float
    bytes_moved_per_step: float
    gpus: list[GpuFit]
    breakdown: MemoryBreakdown | None = Field(
        None, description="tensor memory at the peak by what holds it, without a GPU's context and cuBLAS workspace")
    assumptions: list[str]
    elapsed_s: float
    fingerprint: FingerprintSection | None = Field(
        None, description="the model's fingerprint, by the same rule as the training hooks: runs of this model with "
                          "this optimizer share it (GET /api/v1/jobs?fingerprint=); null id with a step of your own")
