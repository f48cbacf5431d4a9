"""The estimate itself, in-process: trace, replay through the allocator per GPU, search the batch size,
roofline time and energy. Runs inside the worker started by `runner.run_estimate`, never in the API."""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Collection
from dataclasses import dataclass

import torch

from fleetprof.report import FingerprintSection
from server.analysis.base.gpu_catalog import GpuModel, find_model, load_catalog
from server.analysis.planning.allocator import AllocatorStats, CachingAllocatorSim, SimulatedOutOfMemory
from server.estimate.breakdown import classify, estimate_breakdown
from server.estimate.calibration import calibration_for
from server.estimate.errors import AbsurdRequestError, UnknownGpuError
from server.estimate.fingerprint import estimate_fingerprint
from server.estimate.meta_kernels import MetaKernels
from server.estimate.models import ResolvedModel, resolve
from server.estimate.roofline import EFFICIENCY, power_fraction, step_time
from server.estimate.schemas import MAX_BATCH_SIZE, EstimateRequest, EstimateResponse, GpuFit, RooflineEstimate
from server.estimate.trace_step import StepSettings, StepTrace, trace_step
from server.estimate.tracer import Trace
from server.estimate.user_step import UserStep

MAX_BYTES = 10**15  # 1 PB: no device or cluster of devices holds a step this large
_DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "int64": 8, "int32": 4, "bool": 1}


def _check_absurd(request: EstimateRequest) -> None:
    if request.batch_size > MAX_BATCH_SIZE:
        raise AbsurdRequestError(f"batch_size {request.batch_size} is above the limit of {MAX_BATCH_SIZE}")
    for spec in request.inputs:
        if any(d < 1 for d in spec.shape):
            raise AbsurdRequestError(f"input shape {spec.shape} has a dimension below 1")
        nbytes = request.batch_size * math.prod(spec.shape) * _DTYPE_BYTES[spec.dtype]
        if nbytes > MAX_BYTES:
            raise AbsurdRequestError(
                f"input {spec.name or 'positional'} of shape [{request.batch_size}, {', '.join(map(str, spec.shape))}] "
                f"alone is {nbytes / 1e15:.1f} PB"
            )


def _gpus(names: list[str] | None) -> list[GpuModel]:
    if names is None:
        return list(load_catalog())
    found = []
    for name in names:
        gpu = find_model(name)
        if gpu is None:
            known = ", ".join(m.name for m in load_catalog())
            raise UnknownGpuError(f"unknown GPU type {name!r}; known: {known}")
        found.append(gpu)
    return found


@dataclass
class _Fit:
    stats: AllocatorStats
    fits: bool


def _built_once(resolved: ResolvedModel) -> ResolvedModel:
    """`resolved` whose `build` returns the same model on each call for a device, its gradients cleared (a step
    leaves none after zero_grad(set_to_none=True); a user's step may). Meta parameters hold no values, so the
    steps of one trace leave nothing the next could see: every storage is registered afresh as the baseline."""
    models: dict[torch.device, torch.nn.Module] = {}

    def build(device: torch.device) -> torch.nn.Module:
        model = models.get(device)
        if model is None or device.type != "meta":
            model = models[device] = resolved.build(device)
        for p in model.parameters():
            p.grad = None
        return model

    return dataclasses.replace(resolved, build=build)


class _Estimator:
    """Traces per batch size (cached) and allocator replays per (batch size, GPU)."""

    def __init__(self, resolved: ResolvedModel, settings: StepSettings) -> None:
        # one model for every traced batch size (a 7 B model takes ~1 s to build on meta); not with activation
        # checkpointing, whose generic switch wraps the blocks' forwards again on every call
        self.resolved = resolved if settings.activation_checkpointing else _built_once(resolved)
        self.settings = settings
        self.traces: dict[int, StepTrace] = {}
        self._replays: dict[tuple[int, int, int | None], _Fit] = {}
        self._affine: tuple[list[tuple[int, int, int]], Trace] | None = None
        self.kernels = MetaKernels()  # shared by the traces of all batch sizes: each layer's shapes recur

    def trace(self, batch_size: int) -> StepTrace:
        st = self.traces.get(batch_size)
        if st is None:
            st = trace_step(self.resolved, self.settings, batch_size, self.kernels)
            peak = st.trace.peak_requested_bytes()
            if peak > MAX_BYTES:
                raise AbsurdRequestError(
                    f"batch size {batch_size} needs {peak / 1e15:.1f} PB of device memory for one step"
                )
            self.traces[batch_size] = st
        return st

    def fit_affine(self, b1: int) -> bool:
        """Try the affine model: trace b1 and b1 + 1; every event's size must be a + c x batch with integer
        a, c and the same event order; a third trace at 2 x b1 + 3 must match it byte for byte. Then the
        search replays synthesized traces instead of tracing (seconds instead of minutes on large models)."""
        b2, b3 = b1 + 1, 2 * b1 + 3
        try:
            t1, t2, t3 = (self.trace(b).trace for b in (b1, b2, b3))
        except AbsurdRequestError:
            return False
        if not (len(t1.events) == len(t2.events) == len(t3.events)) or t1.baseline_events != t2.baseline_events:
            return False
        coeffs = []
        for (k1, n1), (k2, n2), (k3, n3) in zip(t1.events, t2.events, t3.events, strict=True):
            slope = n2 - n1
            base = n1 - slope * b1
            if k1 != k2 or k1 != k3 or (n1 > 0) != (n2 > 0) or n3 != base + slope * b3:
                return False
            coeffs.append((k1, base, slope))
        self._affine = (coeffs, t1)
        return True

    def _events_at(self, batch_size: int) -> tuple[list[tuple[int, int]], Trace]:
        if self._affine is not None and batch_size not in self.traces:
            coeffs, template = self._affine
            events = [(k, base + slope * batch_size) for k, base, slope in coeffs]
            if all(n != 0 for _, n in events):
                peak = live = 0
                for _, n in events:
                    live += n
                    peak = max(peak, live)
                if peak > MAX_BYTES:
                    raise AbsurdRequestError(f"batch size {batch_size} needs {peak / 1e15:.1f} PB of device memory")
                return events, template
        trace = self.trace(batch_size).trace
        return trace.events, trace

    def events(self, batch_size: int, workspace_bytes: int) -> list[tuple[int, int]]:
        events, trace = self._events_at(batch_size)
        if not workspace_bytes or not any(op.kind in ("matmul", "attention") for op in trace.ops):
            return events
        # The cuBLAS workspace is allocated at the first GEMM and kept for the process's life, one per cuBLAS
        # handle: the training thread's, and the autograd engine's own device thread's (backward runs there). Seen
        # on an H100 (bench/results/gpu_nvidia_h100_80gb_hbm3*.md): every row allocated 32-34 MiB more than its
        # tensors and one 32 MiB workspace.
        n = trace.baseline_events
        return [*events[:n], (-1, workspace_bytes), (-2, workspace_bytes), *events[n:]]

    def replay(self, batch_size: int, workspace_bytes: int, capacity_bytes: int | None) -> _Fit:
        key = (batch_size, workspace_bytes, capacity_bytes)
        hit = self._replays.get(key)
        if hit is None:
            hit = self._replays[key] = self._bounded(batch_size, workspace_bytes, capacity_bytes)
        return hit

    def _bounded(self, batch_size: int, workspace_bytes: int, capacity_bytes: int | None) -> _Fit:
        """A replay on a device of `capacity_bytes`, decided from the unbounded replay (shared by every GPU with
        the same workspace) where that settles it: a run that never reserves more than the capacity is the same
        run on the smaller device; one whose live blocks alone exceed it cannot fit. Only in between, where
        releasing cached segments may save it, is the bounded run replayed."""
        if capacity_bytes is None:
            return self._replay(batch_size, workspace_bytes, None)
        free = self.replay(batch_size, workspace_bytes, None)
        if free.stats.peak_reserved_bytes <= capacity_bytes:
            return free
        if free.stats.peak_allocated_bytes > capacity_bytes:
            return _Fit(free.stats, False)
        return self._replay(batch_size, workspace_bytes, capacity_bytes)

    def _replay(self, batch_size: int, workspace_bytes: int, capacity_bytes: int | None) -> _Fit:
        sim = CachingAllocatorSim(capacity_bytes)
        try:
            return _Fit(sim.replay(self.events(batch_size, workspace_bytes)), True)
        except SimulatedOutOfMemory:
            return _Fit(sim.stats, False)

    def max_batch(self, gpu: GpuModel, start: int, fits_start: bool, deadline: float) -> tuple[int, bool]:
        """Largest batch that fits: (value, exact). Memory is close to affine in the batch size, so each probe
        is the secant guess through the two nearest traced sizes (exponential growth while no upper bound is
        known), with bisection whenever a guess fails to halve the bracket. `exact` is False when the time
        ran out (the value is then a lower bound)."""
        cal = calibration_for(gpu)
        capacity = gpu.memory_bytes - cal.context_bytes
        ws = cal.cublas_workspace_bytes
        lo, hi = (start, None) if fits_start else (0, start)
        bisect_next = False
        while hi is None or hi - lo > 1:
            if time.monotonic() > deadline:
                return lo, False
            upper = MAX_BATCH_SIZE + 1 if hi is None else hi
            if lo >= MAX_BATCH_SIZE:
                return lo, True
            guess = self._secant(lo, hi, ws, capacity)
            if bisect_next or guess is None:
                guess = lo * 2 if hi is None else (lo + hi) // 2
            guess = min(max(guess, lo + 1), upper - 1)
            if hi is None:
                guess = min(guess, max(lo * 4, 1))  # never jump more than 4x past a traced size
            try:
                ok = self.replay(guess, ws, capacity).fits
            except AbsurdRequestError:
                ok = False
            width = upper - lo
            lo, hi = (guess, hi) if ok else (lo, guess)
            bisect_next = hi is not None and (hi - lo) * 2 > width
        return lo, True

    def _secant(self, lo: int, hi: int | None, ws: int, capacity: int) -> int | None:
        known = sorted({b for b, _, _ in self._replays if b >= 1})
        if len(known) < 2:
            return None
        # the two traced sizes nearest the bracket
        anchor = [b for b in known if b <= max(lo, 1)][-1:] or known[:1]
        other = [b for b in known if b != anchor[0]]
        b2 = min(other, key=lambda b: abs(b - (hi or lo)))
        b1 = anchor[0]
        r1 = self.replay(b1, ws, None).stats.peak_reserved_bytes
        r2 = self.replay(b2, ws, None).stats.peak_reserved_bytes
        if b1 == b2 or r2 == r1:
            return None
        slope = (r2 - r1) / (b2 - b1)
        if slope <= 0:
            return None
        return int(b1 + (capacity - r1) / slope)


ASSUMPTIONS = [
    "One training step = forward + loss (inside the autocast region for AMP) + backward + optimizer.step() + "
    "zero_grad(set_to_none=True); the second of two traced steps is the steady state (optimizer state exists).",
    "batch_size is the micro-batch per GPU; with grad_accumulation > 1 two micro-batches are traced (the rest "
    "repeat the second) and time scales with the number of micro-batches.",
    "AMP follows torch.autocast('cuda') op lists (emulated on meta); GradScaler state (a few scalars) is ignored.",
    "scaled_dot_product_attention uses a fused kernel (flash / memory-efficient), as CUDA picks for these inputs; "
    "dropout is CUDA's fused native_dropout (a bool mask saved for backward). nn.LSTM / GRU / RNN run through "
    "cuDNN: timed as one op per layer and direction forward and two backward (their FLOPs and bytes kept); their "
    "memory is the per-time-step decomposition's saved tensors (cuDNN's reserve and workspace are not modelled).",
    "Optimizer 'foreach' implementation (PyTorch's CUDA default) including its transient per-step buffers.",
    "Allocator: PyTorch's native CUDA caching allocator defaults (no expandable_segments, max_split_size "
    "unlimited), one stream; cuDNN convolution workspaces are not modelled (CNN estimates may run low by up "
    "to the largest workspace cuDNN picks).",
    "Context and cuBLAS workspace per GPU from calibration.json (measured where its entry says so, else "
    "literature-derived); one cuBLAS workspace per handle: the training thread's and the autograd engine's.",
    f"Roofline: per op max(FLOPs / (peak x {EFFICIENCY.compute_fraction}), bytes / (bandwidth x "
    f"{EFFICIENCY.memory_fraction}), {EFFICIENCY.launch_floor_s * 1e6:.0f} us), summed: the GPU's busy time; "
    f"the step takes that or the host's time to issue the ops in eager mode ({EFFICIENCY.host_per_op_s * 1e6:.0f}"
    f" us per traced op, measured on an H100 host; {EFFICIENCY.host_per_op_low_s * 1e6:.0f} us at the band's low "
    f"end), whichever is longer. Band from the pure roofline at 100% peak to {EFFICIENCY.high_factor}x the central "
    "value. Energy = time x TDP x power fraction: while busy 0.5 + 0.35 x compute-bound share, while waiting on "
    f"the host {EFFICIENCY.waiting_power_fraction}; band +-0.15 of TDP on the power fraction.",
]


USER_STEP_ASSUMPTIONS = [
    "One training step = two calls of the step from --step {name} (the caller's own code, estimated on the "
    "caller's machine); the second, with optimizer state allocated, is the steady state. --optimizer and "
    "--grad-accumulation do not apply: the step has its own. torch.autocast('cuda') regions in it are emulated "
    "with the op lists of the canned step; --precision only picks the peak throughput of the time estimate.",
]


CPU_ASSUMPTIONS = [
    ASSUMPTIONS[0],
    ASSUMPTIONS[1],
    "device cpu: the step runs on fake CPU tensors, so PyTorch makes the CPU dispatch choices itself "
    "(torch.autocast('cpu') op lists, the CPU attention kernel, oneDNN LSTM, im2col convolutions); kernels that "
    "allocate inside (oneDNN RNN workspace, convolution column buffers) are run once per shape on zeros and "
    "measured (server/estimate/kernel_probe.py).",
    "device cpu: the CPU allocator neither caches nor rounds: allocated = reserved = requested. Optimizer "
    "'for_loop' unless asked otherwise (PyTorch's CPU default). Allocations oneDNN makes with its own allocator "
    "are not counted (neither does torch.profiler).",
]


def step_settings(request: EstimateRequest, user_step: UserStep | None = None) -> StepSettings:
    """The traced step of a request (`user_step`: the caller's own, --local only); the optimizer implementation
    defaults to the device's."""
    impl = request.optimizer_impl or ("for_loop" if request.device == "cpu" else "foreach")
    return StepSettings(
        optimizer=request.optimizer, optimizer_impl=impl, precision=request.precision,
        grad_accumulation=request.grad_accumulation, activation_checkpointing=request.activation_checkpointing,
        device=request.device, user_step=user_step,
    )


def _cpu_estimate(request: EstimateRequest, resolved: ResolvedModel, st: StepTrace, settings: StepSettings,
                  started: float, fingerprint: FingerprintSection | None) -> EstimateResponse:
    """A plain CPU loop: no GPU, no allocator simulation, no batch search (no capacity to search against)."""
    _, op_start = st.marks["step1"]
    _, op_end = st.marks["end"]
    _, op_opt = st.marks["step1_optimizer"]
    micro_scale = request.grad_accumulation / settings.traced_micro_batches
    fwd_bwd, opt_ops = st.trace.ops[op_start:op_opt], st.trace.ops[op_opt:op_end]
    peak = st.trace.peak_requested_bytes()
    return EstimateResponse(
        model_name=resolved.name, device="cpu", parameter_count=st.parameter_count,
        parameter_bytes=st.parameter_bytes, batch_size=request.batch_size, precision=request.precision,
        optimizer=request.optimizer, peak_requested_bytes=peak, peak_allocated_bytes=peak, peak_reserved_bytes=peak,
        allocations=st.trace.allocations,
        flops_per_step=sum(o.flops for o in fwd_bwd) * micro_scale + sum(o.flops for o in opt_ops),
        bytes_moved_per_step=sum(o.bytes for o in fwd_bwd) * micro_scale + sum(o.bytes for o in opt_ops),
        # the CPU allocator neither rounds nor caches: allocated = reserved = requested, and there is no CUDA context
        gpus=[], breakdown=estimate_breakdown(
            classify(st.trace, st.origins), AllocatorStats(peak, peak, peak), context_bytes=0,
            context_source="device cpu: no CUDA context"),
        assumptions=CPU_ASSUMPTIONS, elapsed_s=time.monotonic() - started, fingerprint=fingerprint,
    )


def estimate(request: EstimateRequest, *, search_budget_s: float = 30.0,
             registered: Collection[str] = (), user_step: UserStep | None = None) -> EstimateResponse:
    """`registered`: the factories an operator registered, besides the zoo (server.estimate.allowlist).
    `user_step`: the caller's own training step in place of the canned one (`--local --step` only: the API never
    passes one, and a request has no field to name one)."""
    started = time.monotonic()
    _check_absurd(request)
    if user_step is not None and request.grad_accumulation != 1:
        raise AbsurdRequestError("grad_accumulation does not apply with a step of your own: accumulate in the step")
    gpus = _gpus(request.gpu_types) if request.device == "cuda" else []
    resolved = resolve(request.model, request.inputs, request.seq_len, request.target, registered=registered)
    settings = step_settings(request, user_step)
    est = _Estimator(resolved, settings)
    st = est.trace(request.batch_size)
    fingerprint = estimate_fingerprint(
        est.resolved.build(torch.device("meta")), optimizer=request.optimizer if user_step is None else None,
        precision=request.precision, batch_size=request.batch_size)
    if request.device == "cpu":
        return _cpu_estimate(request, resolved, st, settings, started, fingerprint)
    base = est.replay(request.batch_size, 0, None).stats
    parts = classify(st.trace, st.origins)

    # time: ops of the last traced step; forward/backward scaled to the requested micro-batch count
    _, op_start = st.marks["step1"]
    _, op_opt = st.marks["step1_optimizer"]
    _, op_end = st.marks["end"]
    fwd_bwd, opt_ops = st.trace.ops[op_start:op_opt], st.trace.ops[op_opt:op_end]
    micro_scale = request.grad_accumulation / settings.traced_micro_batches
    autocast = {"amp_fp16": "fp16", "amp_bf16": "bf16"}.get(request.precision)
    deadline = started + search_budget_s
    if request.search_max_batch:
        # batch 1 may take other code paths (squeezed dims, other kernels): the affine model starts at 2
        est.fit_affine(max(request.batch_size, 2))

    results = []
    for gpu in gpus:
        cal = calibration_for(gpu)
        capacity = gpu.memory_bytes - cal.context_bytes
        unlimited = est.replay(request.batch_size, cal.cublas_workspace_bytes, None)
        limited = est.replay(request.batch_size, cal.cublas_workspace_bytes, capacity)
        fits = limited.fits
        reserved = (limited if fits else unlimited).stats.peak_reserved_bytes
        device_total = reserved + cal.context_bytes
        max_batch, exact = (None, False)
        if request.search_max_batch:
            max_batch, exact = est.max_batch(gpu, request.batch_size, fits, deadline)
        t_fb = step_time(fwd_bwd, gpu, autocast)
        t_opt = step_time(opt_ops, gpu, autocast)
        central = t_fb.central_s * micro_scale + t_opt.central_s
        low = t_fb.low_s * micro_scale + t_opt.low_s
        high = t_fb.high_s * micro_scale + t_opt.high_s
        gpu_busy = t_fb.gpu_s * micro_scale + t_opt.gpu_s
        compute_share = (t_fb.compute_bound_fraction * t_fb.gpu_s * micro_scale
                         + t_opt.compute_bound_fraction * t_opt.gpu_s) / gpu_busy if gpu_busy else 0.0
        pf = power_fraction(compute_share, min(1.0, gpu_busy / central) if central else 1.0)
        results.append(GpuFit(
            gpu=gpu.name, memory_total_bytes=gpu.memory_bytes, context_bytes=cal.context_bytes,
            cublas_workspace_bytes=cal.cublas_workspace_bytes,
            peak_allocated_bytes=unlimited.stats.peak_allocated_bytes,
            peak_reserved_bytes=reserved, device_total_bytes=device_total, fits=fits,
            headroom_bytes=gpu.memory_bytes - device_total, max_batch_size=max_batch, max_batch_size_exact=exact,
            roofline=RooflineEstimate(
                time_per_step_s=central, time_per_step_low_s=low, time_per_step_high_s=high,
                compute_bound_fraction=compute_share,
                energy_per_step_j=central * gpu.tdp_w * pf,
                energy_per_step_low_j=low * gpu.tdp_w * max(pf - 0.15, 0.2),
                energy_per_step_high_j=high * gpu.tdp_w * min(pf + 0.15, 1.0),
                gpu_busy_s=gpu_busy, host_issue_s=t_fb.host_s * micro_scale + t_opt.host_s,
                host_bound=t_fb.host_s * micro_scale + t_opt.host_s > gpu_busy,
            ),
            calibration_source=cal.source + ("" if cal.measured else " (not measured)"),
            breakdown=estimate_breakdown(
                parts, (limited if fits else unlimited).stats,
                workspace_bytes=unlimited.stats.peak_requested_bytes - base.peak_requested_bytes,
                context_bytes=cal.context_bytes, context_source="calibration: " + cal.source,
            ),
        ))
    return EstimateResponse(
        model_name=resolved.name, device="cuda", parameter_count=st.parameter_count, parameter_bytes=st.parameter_bytes,
        batch_size=request.batch_size, precision=request.precision, optimizer=request.optimizer,
        peak_requested_bytes=base.peak_requested_bytes, peak_allocated_bytes=base.peak_allocated_bytes,
        peak_reserved_bytes=base.peak_reserved_bytes, allocations=st.trace.allocations,
        flops_per_step=sum(o.flops for o in fwd_bwd) * micro_scale + sum(o.flops for o in opt_ops),
        bytes_moved_per_step=sum(o.bytes for o in fwd_bwd) * micro_scale + sum(o.bytes for o in opt_ops),
        gpus=results, breakdown=estimate_breakdown(parts, base), elapsed_s=time.monotonic() - started,
        fingerprint=fingerprint,
        assumptions=ASSUMPTIONS if user_step is None else [
            *(a.format(name=user_step.name) for a in USER_STEP_ASSUMPTIONS), *ASSUMPTIONS[2:]],
    )
