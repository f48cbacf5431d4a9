"""Answers of the REST API that clients read typed, beside the report (`fleetprof.report`): one definition, which the
server answers with and the dashboard validates against.

Like the report, they live in the bare package (pydantic only) so that a client needs no server code to read them.
Fields may be added, never renamed (PRODUCT.md).
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from fleetprof.report import HealthFinding


class JobRead(BaseModel):
    """GET /api/v1/jobs/{job_id}: a job's metadata and state. Times are epoch s."""

    job_id: str
    team: str | None
    name: str | None
    command: str | None
    framework: str | None
    host: str | None
    user: str | None
    node: str | None
    state: str
    batch_size: int | None
    gpu_type_requested: str | None
    gpus_requested: int | None
    exit_code: int | None
    created_at: float
    updated_at: float
    started_at: float | None
    ended_at: float | None
    duration_s: float | None
    gpu_uuids: list[str]
    metadata: dict[str, Any]
    end_reason: str | None = Field(default=None, description="why the server ended the job (state `lost`); "
                                   "null when whoever ran it reported its end")
    fingerprint: str | None = Field(default=None, description="the model's fingerprint (fleetprof/fingerprint.py): "
                                    "shared by runs of the same model in other configurations; null: unknown")


class JobList(BaseModel):
    """GET /api/v1/jobs: one page of jobs, newest first."""

    items: list[JobRead]
    total: int
    limit: int
    offset: int


class JobWaste(BaseModel):
    """A job's fleet row (server.analysis.fleet.rollup.job_fleet_row), ranked by wasted GPU-hours."""

    model_config = ConfigDict(extra="allow")

    job_id: str | None = None
    team: str | None = None
    state: str | None = None
    gpus: int | None = None
    gpu_hours: float | None = None
    gpu_busy_fraction: float | None = None
    wasted_gpu_hours: float | None = Field(None, description="gpu_hours x (1 - gpu_busy_fraction)")
    memory_stranded_bytes: int | None = None
    idle_energy_j: float | None = Field(None, description="energy the job's GPUs drew while idle")


class Goodput(BaseModel):
    """Allocated GPU time (inside jobs' windows) split into buckets that add up to it (docs: "Goodput")."""

    allocated_gpu_hours: float
    idle_gpu_hours: float = Field(description="utilization below the idle threshold for 60 s or more")
    input_stalled_gpu_hours: float = Field(description="no kernel running while the job ran: busy samples' "
                                                       "(1 - utilization) and shorter idle gaps")
    throttled_gpu_hours: float = Field(description="kernel time under a slowdown clock-event reason")
    productive_gpu_hours: float = Field(description="kernel time at full clocks")
    unknown_gpu_hours: float = Field(description="utilization unknown, or hours rolled up before goodput existed")
    productive_fraction: float | None = Field(description="productive / (allocated - unknown)")


class TeamGoodput(Goodput):
    team: str | None = Field(description="null: jobs without a team")


class GpuAttention(BaseModel):
    """A GPU with health findings over the recent window."""

    node: str
    gpu_uuid: str
    gpu_index: int
    gpu_name: str | None
    severity: str | None = Field(description="the worst of its findings: critical, warning or info")
    findings: list[HealthFinding]


class FleetSummary(BaseModel):
    """GET /api/v1/fleet/summary: the fleet over a window, from hourly rollups and the stored job fleet rows."""

    model_config = ConfigDict(extra="allow")

    window_s: float
    generated_at: float = Field(description="epoch s")
    gpus: int = Field(description="GPUs with rollups in the window")
    gpus_total: int
    gpu_hours: float
    busy_gpu_hours: float | None
    busy_fraction: float | None
    util_weighted_gpu_hours: float | None
    idle_gpus_now: int | None
    gpus_unknown_now: int | None
    energy_j: float | None
    memory_stranded_bytes: int | None
    most_wasteful_jobs: list[JobWaste]
    sources: dict[str, str]
    goodput: Goodput | None = Field(None, description="the fleet's allocated GPU-hours in the window, by bucket")
    goodput_by_team: list[TeamGoodput] = Field(default_factory=list)
    gpus_needing_attention: list[GpuAttention] = Field(
        default_factory=list, description="GPUs with health findings over the last attention_window_s")
    attention_window_s: float | None = None


class CompareRatios(BaseModel):
    """A run's figures divided by the baseline's (the first id): 2.0 = twice the baseline; null = unknown."""

    step_time_ratio: float | None = Field(description="step time p50 / baseline's (< 1: faster per step)")
    samples_per_s_ratio: float | None
    energy_per_sample_ratio: float | None
    energy_per_step_ratio: float | None
    peak_used_ratio: float | None = Field(description="NVML peak device memory / baseline's")
    mean_power_ratio: float | None
    duration_ratio: float | None


class RealizedSaving(BaseModel):
    """One measured figure of a run that applied a recommendation, against the run it was compared with: `saving`
    = before - after in `unit` (positive: the figure went down); null when either run does not know it."""

    figure: str = Field(description="the compared run figure, e.g. peak_reserved_bytes, step_time_p50_s")
    unit: str
    before: float | None
    after: float | None
    saving: float | None
    saving_pct: float | None = Field(description="saving / before, in %")
    against_job_id: str = Field(description="the run measured against: the job it came from when compared, else "
                                            "the baseline")
    source: str


class AppliedRecommendation(BaseModel):
    """A recommendation this run started with (`fleetprof run --apply`), as recorded in the job's metadata."""

    kind: str
    summary: str
    from_job: str | None
    setting: str | None = Field(description="what was set, e.g. PYTORCH_CUDA_ALLOC_CONF=...")
    predicted_saving: dict[str, Any] | None = Field(description="the recommendation's `saving` (units in its keys)")
    realized: list[RealizedSaving] = Field(description="the measured difference of the figures it should move")


class CompareRun(BaseModel):
    """One run, with the figures of its characterization report (null where the report cannot know)."""

    job_id: str
    name: str | None
    team: str | None
    framework: str | None
    batch_size: int | None
    state: str | None
    gpu_name: str | None
    gpu_count: int | None
    precision: str | None = Field(None, description="fp32, fp16, bf16, amp_fp16, amp_bf16; null: unknown")
    fingerprint: str | None = Field(None, description="the model's fingerprint (report.fingerprint); null: unknown")
    duration_s: float | None
    peak_used_bytes: int | None
    peak_allocated_bytes: int | None
    peak_reserved_bytes: int | None
    memory_total_bytes: int | None
    gpu_util_mean_pct: float | None
    gpu_busy_fraction: float | None
    steps: int | None
    step_time_p50_s: float | None
    step_time_p95_s: float | None
    samples_per_s: float | None
    energy_j: float | None
    energy_source: str | None
    energy_per_step_j: float | None
    energy_per_sample_j: float | None
    mean_power_w: float | None
    analyzed_at: float | None
    vs_baseline: CompareRatios
    differs_from_baseline: list[str] = Field(description="setup fields that differ from the baseline's")
    applied: list[AppliedRecommendation] = Field(
        default_factory=list, description="recommendations this run applied (`fleetprof run --apply`)")


class CompareBest(BaseModel):
    fastest_per_step: str | None
    highest_throughput: str | None
    least_energy_per_sample: str | None
    least_energy_per_step: str | None
    smallest_peak_memory: str | None


class CompareOut(BaseModel):
    """GET /api/v1/jobs/compare: runs of one model side by side, the first id's run the baseline."""

    baseline_job_id: str
    jobs: list[CompareRun]
    best: CompareBest
    findings: list[str]


# --------------------------------------------------------------------- characterization across configurations (#21)
ConfigurationAxis = Literal["gpu_type", "gpu_count", "batch_size", "precision", "framework"]


class ConfigurationFigures(BaseModel):
    """A run's (or a configuration's median) figures; null = unknown, never 0. Units in the names."""

    step_time_s: float | None = Field(description="step time p50 (framework hooks)")
    samples_per_s: float | None
    peak_memory_bytes: int | None = Field(description="NVML peak device memory; on a CPU run the peak process RSS")
    memory_total_bytes: int | None = Field(description="the device's memory (the host's on a CPU run)")
    headroom_bytes: int | None = Field(description="memory_total_bytes - peak_memory_bytes")
    energy_per_step_j: float | None
    energy_per_sample_j: float | None
    cost_per_step_usd: float | None = Field(description="catalogue price_per_hour_usd x GPU count x step time; null "
                                                        "without a catalogue price (CPU runs, unknown GPUs)")
    energy_cost_per_step_usd: float | None = Field(description="energy per step x PUE x the report's price per kWh")
    gpu_util_mean_pct: float | None
    mfu_fraction: float | None = Field(description="model FLOPs utilization: the job's stored estimate's FLOPs per "
                                                   "step (scaled to its batch size) / step time / the GPU's catalogue "
                                                   "peak at its precision; null without an estimate or a GPU")


class ConfigurationRun(ConfigurationFigures):
    job_id: str
    name: str | None
    state: str | None
    gpu_type: str | None = Field(description="the GPU model; 'cpu' for a CPU-only run")
    gpu_count: int | None
    batch_size: int | None
    precision: str | None = Field(description="fp32, fp16, bf16, amp_fp16, amp_bf16 (report.fingerprint)")
    framework: str | None = Field(description="name and version, e.g. 'pytorch 2.13.0'")
    energy_source: str | None
    mfu_source: str | None


class Configuration(ConfigurationFigures):
    """The runs with one value on every axis; figures are the medians over those runs that know them."""

    gpu_type: str | None
    gpu_count: int | None
    batch_size: int | None
    precision: str | None
    framework: str | None
    runs: int
    job_ids: list[str]


class FindingRatio(BaseModel):
    figure: str = Field(description="a ConfigurationFigures field, e.g. samples_per_s")
    unit: str
    baseline: float = Field(description="the figure in the `from` configuration")
    value: float = Field(description="the figure in the `to` configuration")
    ratio: float = Field(description="value / baseline")


class ConfigurationFinding(BaseModel):
    """Two configurations that differ in exactly one axis: what changing it did, as ratios with units."""

    axis: ConfigurationAxis
    from_value: str
    to_value: str
    same: dict[str, str | int | None] = Field(description="the other axes' shared values")
    ratios: list[FindingRatio]
    summary: str = Field(description='e.g. "amp_bf16 vs fp32 (precision) on 1x A100-80GB, batch 64, pytorch 2.13.0: '
                                     '1.70x the throughput (samples/s), 0.55x the energy per sample (J/sample)"')


class CharacterizationOut(BaseModel):
    """GET /api/v1/jobs/characterization: the runs of one model (a fingerprint, or chosen job ids) across GPU types,
    GPU counts, batch sizes, precisions and frameworks."""

    fingerprint: str | None = Field(description="the fingerprint asked for, or the chosen runs' one when they share it")
    model_class: str | None
    parameter_count: int | None
    runs_total: int = Field(description="runs of the fingerprint visible to this token")
    runs: list[ConfigurationRun] = Field(description="newest first; at most `limit`")
    configurations: list[Configuration]
    axes_varied: list[ConfigurationAxis] = Field(description="the axes with more than one value among the runs")
    findings: list[ConfigurationFinding]
    notes: list[str]


# ------------------------------------------------------------------------------------------- captures (issue #19)
CaptureKind = Literal["kineto", "allocator"]
CaptureState = Literal["requested", "delivered", "capturing", "uploaded", "analyzed", "failed"]
CaptureReport = Literal["delivered", "capturing", "failed"]
TriggerKind = Literal["manual", "step_time_regression", "straggler"]
MAX_CAPTURE_STEPS = 100


class CaptureCreate(BaseModel):
    """POST /api/v1/jobs/{job_id}/captures: what to capture of a running job."""

    model_config = ConfigDict(extra="forbid")

    kind: CaptureKind = Field(description="kineto: torch.profiler over the steps; allocator: the CUDA allocator "
                                          "history over the steps")
    steps: int = Field(ge=1, le=MAX_CAPTURE_STEPS, description="how many training steps to capture")
    ranks: list[Annotated[int, Field(ge=0, le=1_000_000)]] | None = Field(
        None, min_length=1, max_length=4096, description="the ranks that capture; null: every rank")


class CaptureStateUpdate(BaseModel):
    """POST /api/v1/jobs/{job_id}/captures/{capture_id}/state: the hooks' report of where a capture is."""

    model_config = ConfigDict(extra="forbid")

    state: CaptureReport
    reason: str | None = Field(None, max_length=2000, description="why it failed (required with `failed`)")
    rank: int | None = Field(None, ge=0, le=1_000_000, description="the reporting process's rank")


class CaptureTrigger(BaseModel):
    """Why a capture was requested: by someone (`manual`), or by the server on a step-time regression or a straggler
    rank, with its evidence (the step medians in seconds, their factor and the steps they cover)."""

    model_config = ConfigDict(extra="allow")

    kind: TriggerKind
    summary: str
    baseline_median_step_s: float | None = None
    recent_median_step_s: float | None = None
    factor: float | None = None
    baseline_steps: list[int] | None = Field(None, description="[first, last] step of the baseline window")
    recent_steps: list[int] | None = Field(None, description="[first, last] step of the recent window")
    rank: int | None = Field(None, description="the rank whose steps were compared")
    straggler_rank: int | None = None
    healthy_rank: int | None = None


class Capture(BaseModel):
    """A live capture and its state. Times are ISO-8601 UTC."""

    capture_id: str
    job_id: str
    kind: CaptureKind
    steps: int
    ranks: list[int] | None
    state: CaptureState
    reason: str | None
    trigger: CaptureTrigger
    requested_at: datetime
    delivered_at: datetime | None
    capturing_at: datetime | None
    uploaded_at: datetime | None
    analyzed_at: datetime | None
    failed_at: datetime | None
    trace_ids: list[int]
    requested_by: str | None


class CaptureList(BaseModel):
    """GET /api/v1/jobs/{job_id}/captures: newest first."""

    captures: list[Capture]


class Band(BaseModel):
    """A projected figure: the central value and the band the measurement is expected in (same unit)."""

    model_config = ConfigDict(frozen=True)

    central: float
    low: float
    high: float


class ProjectedCategory(BaseModel):
    """One category of the measured step and how it scales onto the target GPU."""

    model_config = ConfigDict(frozen=True)

    category: Literal["compute_bound", "memory_bound", "communication", "idle"]
    measured_fraction: float = Field(description="share of the measured step (the categories add up to 1)")
    ratio: float = Field(description="target time / source time for this category (central)")
    ratio_low: float
    ratio_high: float
    rule: str = Field(description="what the ratio is: the FLOP/s ratio, the bandwidth ratio, ...")


class ProjectedMemory(BaseModel):
    """Memory on the target: the allocator's peaks carry over (same framework, model and batch size); the CUDA
    context is the target's."""

    model_config = ConfigDict(frozen=True)

    peak_allocated_bytes: int | None = Field(description="carried over from the measured run; null: unknown")
    peak_reserved_bytes: int | None = Field(description="carried over from the measured run; null: unknown")
    source_context_bytes: int = Field(description="the source GPU's CUDA context and library workspaces (catalogue)")
    target_context_bytes: int = Field(description="the target GPU's, which replace the source's (catalogue)")
    required_bytes: int | None = Field(description="reserved peak (else allocated) + the target's context; "
                                       "null: no peak measured")
    target_capacity_bytes: int
    fits: bool | None = Field(description="required <= capacity; null: unknown")
    headroom_bytes: int | None
    changes: list[str] = Field(description="what differs on the target, in words")


class ProjectionCalibration(BaseModel):
    """What the fleet measured on both GPU types, which sets the projection's central ratio: runs of the job's own
    model ("fingerprint_runs"), or else other models' runs ("fleet_pairs": how far the datasheet roofline missed
    on them, applied to this job's roofline projection)."""

    model_config = ConfigDict(frozen=True)

    source: Literal["fingerprint_runs", "fleet_pairs"] = Field(description=(
        "fingerprint_runs: runs of the same fingerprint measured on both types; fleet_pairs: other models' runs "
        "measured on both types (the same fingerprint, batch size, precision and GPU count on each)"))
    batch_sizes: list[int | None] = Field(description="fingerprint_runs: the configuration(s) used, the nearest to "
                                          "the job's in batch size (log distance; same precision and GPU count); "
                                          "null: none recorded. fleet_pairs: []")
    source_job_ids: list[str] = Field(description="the runs used on the source GPU type (at most 50 listed)")
    target_job_ids: list[str] = Field(description="the runs used on the target GPU type (at most 50 listed)")
    step_time_ratio: float | None = Field(description="fingerprint_runs: their median step time on the target / on "
                                          "the source; fleet_pairs: null")
    energy_per_step_ratio: float | None = Field(description="fingerprint_runs: idem for energy per step; null: not "
                                                "measured on both, or fleet_pairs (the power model answers)")
    roofline_correction: float | None = Field(default=None, description=(
        "fleet_pairs: the median of measured / roofline-projected step-time ratio over the pairs, applied to this "
        "job's roofline projection; fingerprint_runs: null"))
    models: int = Field(default=1, description="how many models (fingerprints) the runs used are of")
    pairs: int = Field(default=1, description="how many configurations measured on both types were used")
    band_log_halfwidth: float = Field(description="the step time's band: the central value x/÷ exp(this), "
                                      "calibrated on measured pairs")
    energy_band_log_halfwidth: float | None = Field(description="idem for the energy per step; null: the energy's "
                                                    "band is the power model's x the step time's")
    rule: str


class ProjectionOut(BaseModel):
    """GET /api/v1/jobs/{job_id}/projection?gpu=TYPE: a measured run projected onto another GPU type."""

    model_config = ConfigDict(frozen=True)

    job_id: str | None = None
    source_gpu: str = Field(description="catalogue name of the GPU the job ran on")
    target_gpu: str = Field(description="catalogue name of the GPU projected onto")
    basis: Literal["kineto", "telemetry"] = Field(description="kineto: per-category split from a trace; telemetry: "
                                                  "NVML busy fraction and the run's mean power only")
    measured_step_time_s: float
    step_time_s: Band = Field(description="projected step time on the target (s)")
    step_time_ratio: Band = Field(description="projected / measured step time")
    measured_power_w: float | None = Field(description="the run's mean power while stepping; null: not measured")
    power_w: Band = Field(description="projected mean power on the target (W)")
    power_source: str = Field(description="'measured, scaled by the power model' or 'power model'")
    measured_energy_per_step_j: float | None
    energy_per_step_j: Band = Field(description="projected energy per step on the target (J)")
    cost_per_step_usd: Band | None = Field(description="projected step time x the target's list price; null: no "
                                           "price in the catalogue")
    measured_cost_per_step_usd: float | None
    memory: ProjectedMemory
    categories: list[ProjectedCategory]
    band_rule: str = Field(description="how the band was built (and where its coverage is measured)")
    notes: list[str]
    band_source: str | None = Field(default=None, description="'calibrated: ...' (telemetry basis: a quantile of "
                                    "the calibration pairs' |log error|) or 'structural: ...' (kineto basis)")
    split_source: str | None = Field(default=None, description="where the compute-/memory-bound split of the busy "
                                     "time came from (kernel names, or the source run's power against the power "
                                     "rule, or the prior)")
    calibration: ProjectionCalibration | None = Field(default=None, description=(
        "set when runs of the job's fingerprint were measured on both GPU types: their measured ratios replace "
        "the datasheet ratios' (the categories still show the datasheet rules); null: none visible"))


class CandidateGpu(BaseModel):
    """Right-sizing's view of one other GPU type for the latest run: its projection in ratios to the measurement."""

    model_config = ConfigDict(frozen=True)

    gpu: str = Field(description="catalogue name")
    summary: str = Field(description="e.g. 'on L40S: 1.80x the step time [1.4-2.3], 42 % less cost per step'")
    basis: Literal["kineto", "telemetry"]
    step_time_ratio: Band = Field(description="projected / measured step time")
    cost_per_step_ratio: Band | None = Field(description="projected / measured cost per step (per epoch alike); "
                                             "null: a price is missing from the catalogue")
    energy_per_step_ratio: Band | None = Field(description="projected / measured energy per step; null: the run's "
                                               "energy is unknown")
    fits: bool | None = Field(description="the run's reserved peak + the target's CUDA context fit; null: unknown")
    calibration_source: Literal["fingerprint_runs", "fleet_pairs"] | None = Field(default=None, description=(
        "what the fleet measured on both GPU types set the ratios (ProjectionCalibration.source; GET "
        "/api/v1/jobs/{job_id}/projection shows which runs); null: the datasheet roofline alone"))
