"""The job report (GET /api/v1/jobs/{job_id}/report) as one typed, frozen model: every section and figure.

It lives in `fleetprof/` (the bare install: pydantic only) so that every client, the CLI, the dashboard and a
scheduler's script, reads the same type the server writes. Units are in the names (PRODUCT.md); a figure that
cannot be known is `None`, never 0. `sources` names where each headline figure came from.

Keys clients rely on (PRODUCT.md) never change names; fields may be added. Sections are closed
(`extra="forbid"`: a figure the analyzers add must be declared here first) except where the report is
open-ended by nature, each marked `OPEN`: recommendation evidence and savings (one shape per kind), right-sizing
inputs (the history record, read back by the right-sizing analyzer), Kineto trace summaries and the
optimization plans (the trace analyzers' documents, also served typed by /plans), and `sources` (a new source
key may come with a new section).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

Json = dict[str, Any]

EnergySource = Literal["hardware_counter", "integrated_power", "mixed"]
"""Joules from NVML's total-energy counter, from integrating the power samples (trapezoids), or both."""


class Section(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class OpenSection(BaseModel):
    """OPEN: a document whose keys depend on the data (see the module docstring)."""

    model_config = ConfigDict(frozen=True, extra="allow")


# ------------------------------------------------------------------------------------------------------ gpus[]
class GpuReport(Section):
    uuid: str
    name: str | None
    memory_total_bytes: int | None
    peak_used_bytes: int | None = Field(description="largest NVML used memory on this GPU in the job's window")
    headroom_bytes: int | None
    peak_used_fraction: float | None
    energy_j: float | None
    energy_source: EnergySource | None
    mean_power_w: float | None
    idle_energy_j: float | None
    counter_resets: int
    power_source: str | None = Field(description="the NVML / nvidia-smi field that fed power_w")
    gpu_util_mean_pct: float | None
    samples: int
    first_ts: float | None = Field(description="epoch s")
    last_ts: float | None = Field(description="epoch s")
    power_limit_w: float | None = Field(None, description="the enforced power limit for most of the job's samples "
                                                          "(NVML nvmlDeviceGetEnforcedPowerLimit)")
    power_limit_changed: bool | None = Field(None, description="whether the limit changed during the job")
    app_sm_clock_mhz: float | None = Field(None, description="application SM clock (nvmlDeviceGetApplicationsClock)")
    app_mem_clock_mhz: float | None = Field(None, description="application memory clock")


# ------------------------------------------------------------------------------------------------------ memory
class ProcessMemory(Section):
    pid: int
    gpu_uuid: str
    peak_used_bytes: int | None
    job_id: str | None = Field(description="this job's id when the process is this job's; null otherwise (another "
                                           "job may be another team's: its id is not shown)")
    whose: Literal["this job", "another job", "unattributed"] = Field(
        description="whose the agent said the process was: this job's, another job's, or nobody could tell")
    attribution: str | None
    first_seen: float = Field(description="epoch s")
    last_seen: float = Field(description="epoch s")


class MemoryTimeline(Section):
    uuid: str
    ts: list[float] = Field(description="epoch s")
    used_bytes: list[float | None]


class MemorySection(Section):
    peak_used_bytes: int | None = Field(description="largest single-GPU NVML peak: what must fit on one device")
    peak_used_gpu: str | None
    peak_allocated_bytes: int | None
    peak_reserved_bytes: int | None
    headroom_bytes: int | None = Field(description="what is left on the GPU closest to running out")
    fragmentation_bytes: int | None = Field(description="peak reserved - peak allocated")
    fragmentation_fraction: float | None
    memory_total_bytes: int | None
    non_framework_bytes: int | None = Field(description="CUDA context, library workspaces, other users")
    oom_detected: bool
    oom_suspected: bool
    oom_evidence: list[str]
    process_peak_bytes: int | None
    job_processes: int | None
    other_processes: int | None
    other_processes_peak_bytes: int | None
    processes: list[ProcessMemory]
    timeline: list[MemoryTimeline]


class BreakdownPart(Section):
    bytes: int | None = Field(description="null: not known from this source")
    source: str = Field(description="where the figure came from, or why it is unknown")


class ModuleActivations(Section):
    module: str = Field(description="top-level module (a named child of the model), or "
                                    "'(model, outside its children)'")
    bytes: int


class MemoryBreakdown(Section):
    """Device memory at the peak by what holds it, as the characterization papers split it. The parts that are
    known add up to `total_bytes` (peak reserved + CUDA context where both are known)."""

    at: str = Field(description="the moment broken down, e.g. 'peak allocated' of the step")
    weights: BreakdownPart = Field(description="parameters and buffers")
    gradients: BreakdownPart
    optimizer_state: BreakdownPart
    activations: BreakdownPart = Field(description="tensors saved for backward (not parameters)")
    activations_by_module: list[ModuleActivations] = Field(description="activations split by top-level module")
    inputs: BreakdownPart = Field(description="the batch")
    temporaries_and_workspaces: BreakdownPart = Field(description="everything else live: op outputs not saved, "
                                                                  "optimizer scratch, cuBLAS workspace")
    step_allocations: BreakdownPart | None = Field(
        default=None, description="allocated inside a measured window and live at the peak: activations and "
                                  "temporaries together, where they cannot be split")
    step_allocations_by_module: list[ModuleActivations] = Field(
        default_factory=list, description="step_allocations split by the top-level module whose forward made them "
                                          "(a Kineto trace's nn.Module calls); an inference trace's are outputs and "
                                          "caches, not tensors kept for backward")
    persistent_unsplit: BreakdownPart = Field(description="live before a measured window began: weights, "
                                              "gradients and optimizer state together, where they cannot be split")
    allocator_rounding: BreakdownPart = Field(description="allocated - requested: blocks rounded up to 512 B")
    cached_free: BreakdownPart = Field(description="reserved - allocated: free blocks the allocator keeps")
    cuda_context: BreakdownPart = Field(description="CUDA context and library code, outside the allocator")
    total_bytes: int | None = Field(description="sum of the known parts")


class AllocConfCandidate(Section):
    alloc_conf: str = Field(description="the PYTORCH_CUDA_ALLOC_CONF value simulated ('' = PyTorch's defaults)")
    peak_reserved_bytes: int | None = Field(description="simulated reserved peak; null: ran out of memory")
    out_of_memory: bool = Field(description="the simulation could not place an allocation within capacity")
    note: str | None = Field(None, description="a condition the setting needs to act")


class AllocConfAdvice(Section):
    """`PYTORCH_CUDA_ALLOC_CONF` settings compared by replaying one device's allocator trace through the
    caching-allocator simulation under each; the recommended one has the lowest simulated reserved peak."""

    device: str
    events: int
    source: str = Field(description="what was simulated, from which trace")
    capacity_bytes: int | None = Field(description="the allowed memory simulated; null: unbounded")
    peak_allocated_bytes: int = Field(description="simulated allocated peak: no setting reserves less")
    recorded_peak_reserved_bytes: int | None = Field(description="the trace's own Total Reserved peak")
    baseline_peak_reserved_bytes: int | None = Field(description="simulated with the defaults; null: out of memory")
    candidates: list[AllocConfCandidate]
    best_alloc_conf: str = Field(description="the setting with the lowest simulated reserved peak ('' = defaults)")
    best_peak_reserved_bytes: int | None
    saving_bytes: int | None = Field(description="baseline - best simulated reserved peak; null: the defaults ran "
                                                 "out of memory in the simulation")
    saving_pct: float | None = Field(description="saving_bytes / baseline_peak_reserved_bytes x 100")
    env: str | None = Field(description="the environment line to set; null: keep the defaults")


# -------------------------------------------------------------------------------------------------------- time
class StepTime(Section):
    mean: float | None
    p50: float | None
    p95: float | None
    p99: float | None


class InputStalls(Section):
    stall_fraction: float | None
    periodic: bool | None
    stall_period_s: float | None


class Straggler(Section):
    rank: int | None = Field(description="from the hooks' per-rank step times")
    gpu_uuid: str | None = Field(None, description="when found from NVML alone (busy phase per iteration)")
    median_step_s: float | None = Field(description="hooks: the rank's median step time; NVML: the iteration period "
                                                    "from telemetry while it straggled (its peers' signals over that "
                                                    "span, else the job's period; null: not detected)")
    slowdown_fraction: float = Field(description="hooks: rank median / job median - 1; NVML: the GPU's busy phase "
                                                 "/ its peers' median - 1, median over the windows it straggled in")
    busy_phase_s: float | None = Field(None, description="NVML: the GPU's kernel-busy time per iteration")
    peer_busy_phase_s: float | None = Field(None, description="NVML: the peers' median busy time per iteration")
    since_ts: float | None = Field(None, description="epoch s: start of the first window it straggled in")
    until_ts: float | None = Field(None, description="epoch s: end of the last")
    seconds: float | None = Field(None, description="time of the windows it straggled in")
    window_s: float | None = Field(None, description="NVML: the analysis window (a few iterations)")
    likely_cause: str | None = None
    throttled_fraction: float | None = Field(None, description="share of those windows under its commonest "
                                                               "slowdown reason")
    sm_clock_mean_mhz: float | None = None
    peer_sm_clock_mean_mhz: float | None = None
    power_mean_w: float | None = None
    peer_power_mean_w: float | None = None
    source: str | None = None


class Stragglers(Section):
    ranks: int | None = Field(description="ranks seen by the hooks; null without hooks")
    median_step_s: float | None
    stragglers: list[Straggler]
    gpus: int | None = Field(default=None, description="GPUs compared from NVML telemetry")
    source: str | None = Field(default=None, description="hooks, nvml, or hooks+nvml")


class LayerRow(Section):
    module: str
    module_type: str | None
    forward_s: float | None
    backward_s: float | None
    activation_bytes: int | None
    calls: int
    total_s: float | None
    parent: str | None
    self_time_s: float | None
    time_fraction: float | None = Field(description="inclusive time / layers_step_time_s")
    self_time_fraction: float | None


class TimeBreakdown(Section):
    """From uploaded Kineto traces (HTA-compatible temporal breakdown), all ranks together."""

    idle_pct: float | None = None
    compute_pct: float | None = None
    non_compute_pct: float | None = None
    span_us: float | None = None
    communication_us: float | None = None


class TimeSection(Section):
    steps: int | None
    step_time_s: StepTime
    warmup_steps_excluded: int
    samples: int | None
    samples_per_s: float | None
    device_time_fraction: float | None
    period_s: float | None = Field(description="iteration period detected from telemetry")
    period_confidence: float | None
    period_signal: str | None
    hook_period_s: float | None
    agrees_with_hooks: bool | None
    steps_per_period: int | None
    gpu_busy_fraction: float | None
    gpu_active_sample_fraction: float | None
    input_stalls: InputStalls
    stragglers: Stragglers | None = Field(description="from the hooks' per-rank step times and from NVML alone "
                                                      "(gpu_uuid entries); null when neither could tell")
    gpu_util_spread_pct: float | None
    least_busy_gpu: str | None
    layers: list[LayerRow]
    layers_step_time_s: float | None
    trace_summaries: list[OpenSection]
    breakdown: TimeBreakdown | None = Field(None, description="present once a Kineto trace was uploaded")


# ------------------------------------------------------------------------------------------ utilization, energy
GPM_SOURCE = "NVML GPM"


def sample_source_suffix(sample_source: str | None) -> str:
    """What a figure's source says after its NVML signal when the samples were not a live GPU's: the NVML test
    double (batches with source "test") or a replayed recording (source "replay"); "" for live NVML or unknown."""
    if sample_source == "test":
        return " (NVML test double)"
    if sample_source == "replay":
        return " (replayed recording)"
    return ""


def gpm_source_label(sample_source: str | None) -> str:
    """Where GPM figures came from: "NVML GPM", labelled as such when the samples came from the NVML test double
    or a replayed recording."""
    return GPM_SOURCE + sample_source_suffix(sample_source)


class GpmMeans(Section):
    """NVML GPM means (Hopper and later) over some samples; null: unknown (no GPM, before Hopper or a MIG device, or
    no sample with it). The job's GPUs, the job, and a node's recent window (GET /api/v1/gpus/gpm) carry them."""

    sm_activity_mean_pct: float | None = Field(description="share of SMs busy (GPM SM_UTIL), mean over samples")
    sm_occupancy_mean_pct: float | None = Field(description="active warps against the maximum (GPM SM_OCCUPANCY)")
    tensor_activity_mean_pct: float | None = Field(description="share of time tensor cores were busy "
                                                               "(GPM ANY_TENSOR_UTIL)")
    dram_bw_util_mean_pct: float | None = Field(description="DRAM bandwidth used against the peak (GPM DRAM_BW_UTIL)")
    pcie_tx_mean_bytes_per_s: float | None
    pcie_rx_mean_bytes_per_s: float | None
    nvlink_tx_mean_bytes_per_s: float | None
    nvlink_rx_mean_bytes_per_s: float | None


class GpmGpu(GpmMeans):
    """One GPU's NVML GPM means over the job's samples."""

    gpu_uuid: str
    samples: int = Field(description="the job's samples of this GPU that carry GPM values")
    source: str | None = Field(description="'NVML GPM' (labelled for the NVML test double or a replay); null: unknown")


class GpmSection(GpmMeans):
    """How much of the GPU the job used, where the hardware tells (NVML GPM, Hopper and later): the job's means are
    the means of its GPUs' means (each GPU weighs the same), over the GPUs that have GPM; null: unknown."""

    gpus_with_gpm: int
    source: str | None = Field(description="'NVML GPM' (labelled for the NVML test double or a replay); null: no "
                                           "GPU of the job has GPM")
    gpus: list[GpmGpu]


class UtilizationSection(Section):
    gpu_mean_pct: float | None
    gpu_p95_pct: float | None
    memory_mean_pct: float | None = Field(description="NVML utilization.memory: memory controller busy, not capacity")
    gpm: GpmSection | None = Field(None, description="NVML GPM means (SM activity, occupancy, tensor activity, DRAM "
                                                     "bandwidth); null: not analyzed (reports before issue #20)")


class EnergySection(Section):
    energy_j: float | None = Field(description="sum over the job's GPUs")
    source: EnergySource | None
    mean_power_w: float | None
    energy_per_step_j: float | None
    per_sample_j: float | None
    kwh: float | None
    facility_kwh: float | None = Field(description="kwh x pue")
    co2e_g: float | None
    cost_usd: float | None
    idle_energy_j: float | None
    idle_energy_fraction: float | None
    gpus_without_energy: int
    counter_resets: int
    covered_s: float
    grid_intensity_g_per_kwh: float
    pue: float
    price_per_kwh_usd: float


# ------------------------------------------------------------------------------------------------- framework
class FrameworkSection(Section):
    """What the framework hooks read inside the training process (`fleetprof run`, no code change); null: unknown."""

    batch_size_observed: int | None = Field(description="the hooks' reading (the job's batch_size may be registered)")
    batch_size_observed_source: str | None = Field(
        description="dataloader (a DataLoader's batch_size matching the inputs) or forward_input (commonest leading "
                    "dimension of the model's first input)")
    batch_size_source: str | None = Field(
        description="where the report's batch_size came from: registered (POST /jobs, fleetprof run --batch-size) "
                    "or hooks:<how>")
    model_class: str | None = Field(description="module.qualname of the model (the top module with most parameters)")
    parameter_count: int | None
    optimizers: list[str] | None = Field(description="optimizer class names, in the order they first stepped")
    precision: str | None = Field(description="compute dtype: autocast's when autocast was on, else the parameters'")
    precision_source: str | None = Field(description="autocast or parameters")
    device: str | None
    device_memory_total_bytes: int | None = Field(
        description="what the memory figures are measured against: the CUDA device's memory, or on a CPU-only run "
                    "the host's physical memory (the memory signal there is the process RSS)")
    device_memory_source: str | None = Field(description="cuda_device or host_memory")
    cuda_alloc_conf: str | None = Field(
        None, description="the PYTORCH_CUDA_ALLOC_CONF the job ran with ('' = PyTorch's defaults; null: unknown or "
                          "a CPU-only run)")
    flops_per_step: float | None = Field(None, description="one rank's step, counted once by the hooks")
    flops_per_step_source: str | None = None


class MfuSection(Section):
    """Model FLOPs utilization per GPU: flops_per_step x steps_per_s / peak_flops_per_s (null where one is unknown)."""

    mfu_fraction: float | None
    achieved_flops_per_s: float | None = Field(description="flops_per_step x steps_per_s, per GPU")
    flops_per_step: float | None = Field(description="one rank's (one GPU's) step")
    flops_per_step_source: str | None = Field(description="hooks:torch.utils.flop_counter... or estimate:<model>")
    steps_per_s: float | None
    steps_per_s_source: str | None
    precision: str | None = Field(description="fp32, fp16 or bf16: the peak it is measured against")
    peak_flops_per_s: float | None
    peak_source: str | None


class FingerprintSection(Section):
    """The model's fingerprint and the parts it was computed from (fleetprof/fingerprint.py, one rule for the hooks
    and the estimator). `fingerprint` is shared by every run of the same model and optimizer, whatever its batch
    size, GPU type and count, precision and framework version: those are the configuration, given beside it."""

    fingerprint: str | None = Field(description="20 hex characters; GET /api/v1/jobs?fingerprint= lists its runs")
    module_tree_hash: str | None = Field(description="sha256 of the module tree's types and parameter shapes")
    module_count: int | None = Field(description="modules in the tree, the model itself included")
    model_class: str | None = Field(description="module.qualname of the model")
    parameter_count: int | None
    optimizers: list[str] | None = Field(description="optimizer class names (part of the fingerprint)")
    precision: str | None = Field(description="fp32, fp16, bf16, fp64, amp_fp16, amp_bf16 (configuration)")
    batch_size: int | None = Field(description="the job's batch size (configuration)")
    framework: str | None = Field(description="pytorch, keras, jax (configuration)")
    framework_version: str | None = Field(description="configuration")
    source: Literal["hooks", "estimate"] = Field(description="hooks: read inside the run; estimate: the estimator's "
                                                             "model")


# ------------------------------------------------------------------------------------------ recommendations
class Recommendation(Section):
    kind: str = Field(description="gpu_type, gpu_count, batch_size, power_cap, memory, ...")
    summary: str
    reason: str
    evidence: Json = Field(description="OPEN: the figures behind it, one shape per kind")
    saving: Json | None = Field(description="OPEN: what following it saves (gpu_hours, energy_j, ...); null: none")


class HealthFinding(Section):
    """One thing wrong with one GPU over the job's (or a fleet window's) samples. `kind`: thermal, power_cap,
    hw_slowdown (NVML clock-event reasons; idle, application-clock and sync-boost bits are never slowdowns),
    sm_clock_low, temperature_near_slowdown, xid, ecc_corrected, ecc_uncorrected, retired_pages,
    retired_pages_pending, row_remap, row_remap_pending, row_remap_failed, pcie_replay, nvlink_errors."""

    gpu_uuid: str | None
    kind: str
    seconds: float | None = Field(description="time the finding held (sample-and-hold); null for counted events")
    fraction: float | None = Field(description="seconds / the time the GPU's samples cover in the window "
                                               "(sm_clock_low: / the GPU's busy time)")
    summary: str
    severity: Literal["critical", "warning", "info"] | None = None
    since_ts: float | None = Field(None, description="epoch s: first sample showing it")
    until_ts: float | None = Field(None, description="epoch s: last sample showing it")
    episodes: int | None = Field(None, description="separate stretches of samples showing it")
    count: int | None = Field(None, description="events or errors counted (XIDs, counter increase)")
    xids: list[int] | None = None
    sm_clock_mean_mhz: float | None = Field(None, description="mean SM clock while it held")
    sm_clock_reference_mhz: float | None = Field(None, description="the SM clock it is compared with")
    sm_clock_reference_source: str | None = None
    sm_clock_drop_pct: float | None = Field(None, description="(1 - mean / reference) x 100: the cost in clock")
    temperature_max_c: float | None = None
    slowdown_temperature_c: float | None = None
    slowdown_temperature_source: str | None = None
    source: str | None = Field(None, description="the NVML signal it was read from")


class HealthSection(Section):
    findings: list[HealthFinding] = Field(description="most severe first, then longest")
    gpus_checked: int | None = None
    gpus_with_findings: int | None = None


# -------------------------------------------------------------------------------------------- traces, sources
class TracesSection(Section):
    kineto_files: int
    snapshot_files: int
    kineto: Json | None = Field(None, description="OPEN: per-rank Kineto summaries combined")
    snapshot: Json | None = Field(None, description="OPEN: the latest memory snapshot's summary")


class CaptureComparison(Section):
    """An automatic capture's evidence: the recent step median against the job's baseline."""

    baseline_median_step_s: float
    recent_median_step_s: float
    factor: float = Field(description="recent / baseline")


class CaptureEntry(Section):
    capture_id: str
    kind: str = Field(description="kineto | allocator")
    steps: int
    ranks: list[int] | None = Field(description="null: every rank")
    state: str
    reason: str | None
    trigger_kind: str = Field(description="manual | step_time_regression | straggler")
    trigger_summary: str
    requested_at: float = Field(description="epoch s")
    analyzed_at: float | None = Field(description="epoch s")
    trace_ids: list[int]
    breakdown: TimeBreakdown | None = Field(description="the capture's Kineto time breakdown, its ranks together; "
                                                        "null unless an analyzed kineto capture")
    comparison: CaptureComparison | None = Field(description="automatic captures: recent vs baseline step medians")


class CapturesSection(Section):
    captures: list[CaptureEntry] = Field(description="newest first")


def _source(key: str) -> Any:
    return Field(None, alias=key)


class Sources(Section):
    """Where each headline figure came from (null: the figure is unknown). Keys are `section.figure`."""

    model_config = ConfigDict(frozen=True, extra="allow", populate_by_name=True, serialize_by_alias=True)

    memory_peak_used_bytes: Literal["nvml", "nvml_max"] | None = _source("memory.peak_used_bytes")
    memory_peak_allocated_bytes: str | None = _source("memory.peak_allocated_bytes")
    memory_peak_reserved_bytes: str | None = _source("memory.peak_reserved_bytes")
    memory_fragmentation_bytes: str | None = _source("memory.fragmentation_bytes")
    memory_process_peak_bytes: str | None = _source("memory.process_peak_bytes")
    energy_energy_j: EnergySource | None = _source("energy.energy_j")
    energy_energy_per_step_j: str | None = _source("energy.energy_per_step_j")
    time_steps: str | None = _source("time.steps")
    time_period_s: str | None = _source("time.period_s")
    time_layers: str | None = _source("time.layers")
    time_gpu_busy_fraction: str | None = _source("time.gpu_busy_fraction")
    time_breakdown: str | None = _source("time.breakdown")
    utilization_gpu_mean_pct: str | None = _source("utilization.gpu_mean_pct")
    utilization_memory_mean_pct: str | None = _source("utilization.memory_mean_pct")
    utilization_gpm: str | None = _source("utilization.gpm")
    optimization: str | None = _source("optimization")
    health_findings: str | None = _source("health.findings")
    mfu_mfu_fraction: str | None = _source("mfu.mfu_fraction")


# ------------------------------------------------------------------------------------------------ the report
class JobReport(Section):
    job_id: str
    state: str
    analyzed_at: float = Field(description="epoch s")
    analyzer_version: int
    duration_s: float | None
    name: str | None
    team: str | None
    batch_size: int | None
    gpus: list[GpuReport]
    memory: MemorySection
    time: TimeSection
    utilization: UtilizationSection
    energy: EnergySection
    sources: Sources
    rightsizing_inputs: Json = Field(description="OPEN: this run's record for right-sizing later runs")
    recommendations: list[Recommendation]
    health: HealthSection | None = Field(None, description="throttling, XID, ECC findings; null: not analyzed")
    traces: TracesSection | None = Field(None, description="uploaded traces; null before any upload was merged")
    optimization: Json | None = Field(None, description="OPEN: offset/swap plans and fragmentation findings")
    framework: FrameworkSection | None = Field(None, description="the hooks' reading of the training process; "
                                                                 "null: no hooks")
    captures: CapturesSection | None = Field(None, description="live captures (issue #19); null: none requested")
    fingerprint: FingerprintSection | None = Field(None, description="the model's fingerprint (issue #21); null: "
                                                                     "no hooks, or hooks before fingerprints")
    mfu: MfuSection | None = Field(None, description="model FLOPs utilization (issue #20)")
