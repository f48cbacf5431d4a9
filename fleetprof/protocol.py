"""Wire protocol v1 between agents / framework hooks and the collector.

Both ends validate with these models: the agent before it spools a batch, the server on ingest.
Samples travel column-wise (one list per field, all lists the same length): it is compact on the
wire, cheap to validate and maps straight onto a bulk COPY.

Units are in every name. Energy is the NVML total-energy counter converted from mJ to J at the edge
(the agent), so nothing past the agent ever sees millijoules.
"""

from __future__ import annotations

from typing import Annotated, Final, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, Strict, StrictBool, StrictInt, model_validator

from fleetprof import jobid
from fleetprof.fingerprint import FINGERPRINT_PATTERN, Precision

PROTOCOL_VERSION: Final = 1
SampleSource = Literal["nvml", "replay", "test"]  # where a sample batch comes from

# Sane bounds for wire timestamps (seconds since epoch, UTC): 2000-01-01 .. 2100-01-01 here; the server,
# which knows "now", also refuses samples more than a day in the future.
MIN_EPOCH_S = 946_684_800.0
MAX_EPOCH_S = 4_102_444_800.0

# Numbers are strict: JSON numbers only, never "300" or true (lax pydantic read both as 300 and 1; bool is an int
# in Python). A float field takes an integer (many encoders write 100.0 as 100); an integer field takes no 3.0.
FiniteFloat = Annotated[float, Strict(), Field(allow_inf_nan=False)]
NonNegFloat = Annotated[float, Strict(), Field(ge=0, allow_inf_nan=False)]
Pct = Annotated[float, Strict(), Field(ge=0, le=100, allow_inf_nan=False)]
NonNegInt = Annotated[int, Strict(), Field(ge=0)]
Timestamp = Annotated[float, Strict(), Field(ge=MIN_EPOCH_S, le=MAX_EPOCH_S, allow_inf_nan=False)]
Name = Annotated[str, Field(min_length=1, max_length=200)]
# The one job-id grammar (fleetprof/jobid.py says what it allows and why). Checked by its own function, whose
# message says what is wrong (a failed `pattern` would answer with the whole regex); the schema shows the pattern.
JobId = Annotated[str, Field(min_length=1, max_length=jobid.MAX_LENGTH, json_schema_extra={"pattern": jobid.PATTERN}),
                  AfterValidator(jobid.check_job_id)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class GpuInfo(_Strict):
    """Static facts about one GPU (or MIG device) on a node, sent with every batch (cheap, idempotent)."""

    uuid: Name
    index: NonNegInt
    name: Name
    memory_total_bytes: NonNegInt | None = None
    pci_bus_id: str | None = None
    mig_parent_uuid: str | None = None
    # Which NVML call fed power_w: "field:NVML_FI_DEV_POWER_AVERAGE" (the driver's 1-s mean, read once a second),
    # "field:NVML_FI_DEV_POWER_INSTANT" (read at 10 Hz), "nvmlDeviceGetPowerUsage" (1-s mean on Ampere+ but GA100,
    # instantaneous before; 10 Hz), or "nvidia-smi:power.draw" for a replayed log.
    power_source: str | None = None
    power_limit_w: NonNegFloat | None = None
    tdp_w: NonNegFloat | None = None
    # The GPU's maximum SM clock (nvmlDeviceGetMaxClockInfo(SM)) and the temperature at which the hardware slows
    # the clocks (nvmlDeviceGetTemperatureThreshold(SLOWDOWN)): what sm_clock_mhz and temperature_c are held against.
    max_sm_clock_mhz: NonNegFloat | None = None
    slowdown_temperature_c: FiniteFloat | None = None


class NodeInfo(_Strict):
    hostname: str | None = None
    driver_version: str | None = None
    cuda_version: str | None = None
    nvml_version: str | None = None


# Per-GPU numeric sample fields, in column order: (name, python type). Every one may be null
# (unsupported on that GPU, or not sampled). `*_max_*` are maxima over the shipping interval of the
# agent's faster internal sampling, so that short peaks are not missed between shipped samples.
SAMPLE_FIELDS: tuple[tuple[str, type], ...] = (
    ("memory_used_bytes", int),
    ("memory_used_max_bytes", int),
    ("memory_total_bytes", int),
    ("memory_reserved_bytes", int),
    ("gpu_util_pct", float),
    ("mem_util_pct", float),
    ("power_w", float),
    ("power_max_w", float),
    ("energy_counter_j", float),
    ("temperature_c", float),
    ("sm_clock_mhz", float),
    ("mem_clock_mhz", float),
    ("throttle_reasons", int),
    ("pcie_tx_bytes_per_s", float),
    ("pcie_rx_bytes_per_s", float),
    ("nvlink_tx_bytes_per_s", float),
    ("nvlink_rx_bytes_per_s", float),
    ("ecc_corrected_total", int),
    ("ecc_uncorrected_total", int),
    ("xid_last", int),
    # The power limit the driver enforces now (W) and the application clocks (MHz) the GPU runs kernels at:
    # every sample carries them, so a job's power cap is known even when it changed under it (nvidia-smi -pl).
    ("power_limit_w", float),
    ("app_sm_clock_mhz", float),
    ("app_mem_clock_mhz", float),
    # GPM (GPU performance monitoring, Hopper and later): what the GPU did between two GPM samples one shipping
    # interval apart (nvmlGpmMetricsGet). SM activity is the share of SMs busy, occupancy the active warps against
    # the maximum, tensor activity the share of time the tensor cores were used, DRAM bandwidth against the
    # peak; PCIe and NVLink traffic in bytes/s. Null where the GPU has no GPM (before Hopper, MIG devices).
    ("gpm_sm_activity_pct", float),
    ("gpm_sm_occupancy_pct", float),
    ("gpm_tensor_activity_pct", float),
    ("gpm_dram_bw_util_pct", float),
    ("gpm_pcie_tx_bytes_per_s", float),
    ("gpm_pcie_rx_bytes_per_s", float),
    ("gpm_nvlink_tx_bytes_per_s", float),
    ("gpm_nvlink_rx_bytes_per_s", float),
    # Health counters, cumulative (read every `health_every` intervals, null in between); flags are 0/1.
    # ecc_*_total above are the aggregate (lifetime) counts, these the volatile ones (since the driver loaded).
    ("ecc_corrected_volatile", int),
    ("ecc_uncorrected_volatile", int),
    ("retired_pages_sbe", int),
    ("retired_pages_dbe", int),
    ("retired_pages_pending", int),
    ("remapped_rows_correctable", int),
    ("remapped_rows_uncorrectable", int),
    ("remapped_rows_pending", int),
    ("remapped_rows_failed", int),
    ("pcie_replay_total", int),
    # summed over links: CRC flit + CRC data + replay + recovery error counters
    ("nvlink_errors_total", int),
)
SAMPLE_FIELD_NAMES: tuple[str, ...] = tuple(name for name, _ in SAMPLE_FIELDS)
PCT_FIELDS = frozenset({"gpu_util_pct", "mem_util_pct", "gpm_sm_activity_pct", "gpm_sm_occupancy_pct",
                        "gpm_tensor_activity_pct", "gpm_dram_bw_util_pct"})
GPM_FIELDS: tuple[str, ...] = tuple(name for name in SAMPLE_FIELD_NAMES if name.startswith("gpm_"))
HEALTH_COUNTER_FIELDS: tuple[str, ...] = (
    "ecc_corrected_volatile", "ecc_uncorrected_volatile", "retired_pages_sbe", "retired_pages_dbe",
    "retired_pages_pending", "remapped_rows_correctable", "remapped_rows_uncorrectable", "remapped_rows_pending",
    "remapped_rows_failed", "pcie_replay_total", "nvlink_errors_total")
Flag = Annotated[int, Strict(), Field(ge=0, le=1)]

OptNonNegInt = NonNegInt | None
OptNonNegFloat = NonNegFloat | None


class SampleColumns(_Strict):
    ts: list[Timestamp]
    gpu_uuid: list[Name]
    healthy: list[StrictBool] | None = None
    memory_used_bytes: list[OptNonNegInt] | None = None
    memory_used_max_bytes: list[OptNonNegInt] | None = None
    memory_total_bytes: list[OptNonNegInt] | None = None
    memory_reserved_bytes: list[OptNonNegInt] | None = None
    gpu_util_pct: list[Pct | None] | None = None
    mem_util_pct: list[Pct | None] | None = None
    power_w: list[OptNonNegFloat] | None = None
    power_max_w: list[OptNonNegFloat] | None = None
    energy_counter_j: list[OptNonNegFloat] | None = None
    temperature_c: list[FiniteFloat | None] | None = None
    sm_clock_mhz: list[OptNonNegFloat] | None = None
    mem_clock_mhz: list[OptNonNegFloat] | None = None
    throttle_reasons: list[OptNonNegInt] | None = None
    pcie_tx_bytes_per_s: list[OptNonNegFloat] | None = None
    pcie_rx_bytes_per_s: list[OptNonNegFloat] | None = None
    nvlink_tx_bytes_per_s: list[OptNonNegFloat] | None = None
    nvlink_rx_bytes_per_s: list[OptNonNegFloat] | None = None
    ecc_corrected_total: list[OptNonNegInt] | None = None
    ecc_uncorrected_total: list[OptNonNegInt] | None = None
    xid_last: list[OptNonNegInt] | None = None
    power_limit_w: list[OptNonNegFloat] | None = None
    app_sm_clock_mhz: list[OptNonNegFloat] | None = None
    app_mem_clock_mhz: list[OptNonNegFloat] | None = None
    gpm_sm_activity_pct: list[Pct | None] | None = None
    gpm_sm_occupancy_pct: list[Pct | None] | None = None
    gpm_tensor_activity_pct: list[Pct | None] | None = None
    gpm_dram_bw_util_pct: list[Pct | None] | None = None
    gpm_pcie_tx_bytes_per_s: list[OptNonNegFloat] | None = None
    gpm_pcie_rx_bytes_per_s: list[OptNonNegFloat] | None = None
    gpm_nvlink_tx_bytes_per_s: list[OptNonNegFloat] | None = None
    gpm_nvlink_rx_bytes_per_s: list[OptNonNegFloat] | None = None
    ecc_corrected_volatile: list[OptNonNegInt] | None = None
    ecc_uncorrected_volatile: list[OptNonNegInt] | None = None
    retired_pages_sbe: list[OptNonNegInt] | None = None
    retired_pages_dbe: list[OptNonNegInt] | None = None
    retired_pages_pending: list[Flag | None] | None = None
    remapped_rows_correctable: list[OptNonNegInt] | None = None
    remapped_rows_uncorrectable: list[OptNonNegInt] | None = None
    remapped_rows_pending: list[Flag | None] | None = None
    remapped_rows_failed: list[Flag | None] | None = None
    pcie_replay_total: list[OptNonNegInt] | None = None
    nvlink_errors_total: list[OptNonNegInt] | None = None

    @model_validator(mode="after")
    def _same_length(self) -> SampleColumns:
        n = len(self.ts)
        for name in ("gpu_uuid", "healthy", *SAMPLE_FIELD_NAMES):
            col = getattr(self, name)
            if col is not None and len(col) != n:
                raise ValueError(f"column {name!r} has {len(col)} values, ts has {n}")
        return self

    def __len__(self) -> int:
        return len(self.ts)


class ProcessColumns(_Strict):
    """Per-process GPU memory, attributed to jobs by the agent ('unattributed' is sent as null)."""

    ts: list[Timestamp]
    gpu_uuid: list[Name]
    pid: list[NonNegInt]
    used_memory_bytes: list[OptNonNegInt]
    job_id: list[JobId | None]
    # how the job was found: "env:FLEETPROF_JOB_ID", "env:SLURM_JOB_ID", "k8s:pod", or null
    attribution: list[str | None] | None = None

    @model_validator(mode="after")
    def _same_length(self) -> ProcessColumns:
        n = len(self.ts)
        for name in ("gpu_uuid", "pid", "used_memory_bytes", "job_id", "attribution"):
            col = getattr(self, name)
            if col is not None and len(col) != n:
                raise ValueError(f"column {name!r} has {len(col)} values, ts has {n}")
        return self


class SampleBatch(_Strict):
    protocol_version: Literal[1]
    node: Name
    # (agent_id, seq) is the idempotency key: a batch resent after a lost acknowledgement is stored once.
    agent_id: Name
    seq: NonNegInt
    sent_at: Timestamp
    source: SampleSource = "nvml"
    node_info: NodeInfo | None = None
    gpus: list[GpuInfo] = Field(default_factory=list)
    samples: SampleColumns
    processes: ProcessColumns | None = None
    # Samples the agent's spool had to drop (disk bound reached) since it started: reported, never silent.
    dropped_samples_total: NonNegInt = 0
    # Rows the agent dropped since it started because they failed validation (e.g. a process row whose job id is
    # not one): reported, never silent. Left out (null) while there are none.
    dropped_rows_total: NonNegInt | None = None
    # Agent clock minus server clock, as the agent measured it from the last acknowledgement's Date.
    clock_skew_s: FiniteFloat | None = None


# ---------------------------------------------------------------- framework events


class _EventBase(_Strict):
    job_id: JobId
    ts: Timestamp
    rank: NonNegInt = 0


class JobStartEvent(_EventBase):
    kind: Literal["job_start"]
    host: str | None = None
    pid: NonNegInt | None = None
    framework: str | None = None
    device: str | None = None  # "cuda:0", "cpu"


class JobEndEvent(_EventBase):
    kind: Literal["job_end"]
    exit_code: StrictInt | None = None
    state: Literal["finished", "failed", "killed", "oom"] | None = None
    reason: str | None = Field(default=None, max_length=2000)


class StepEvent(_EventBase):
    kind: Literal["step"]
    step: NonNegInt
    wall_s: NonNegFloat
    device_s: NonNegFloat | None = None
    samples: NonNegInt | None = None
    allocated_peak_bytes: NonNegInt | None = None
    reserved_peak_bytes: NonNegInt | None = None
    # Where the memory figures come from: "cuda_allocator" (max_memory_allocated/reserved, peaks reset
    # per step), "cpu_rss" (process RSS on a CPU-only run), "cpu_profiler".
    memory_source: str | None = None


class LayerEvent(_EventBase):
    kind: Literal["layer"]
    step: NonNegInt
    module: Annotated[str, Field(max_length=500)]
    module_type: Annotated[str, Field(max_length=200)] | None = None
    forward_s: NonNegFloat | None = None
    backward_s: NonNegFloat | None = None
    activation_bytes: NonNegInt | None = None
    calls: NonNegInt = 1


class OomEvent(_EventBase):
    kind: Literal["oom"]
    message: str | None = Field(default=None, max_length=4000)
    requested_bytes: NonNegInt | None = None


class FrameworkInfoEvent(_EventBase):
    """What right-sizing decisions need from inside the training process, sent by the hooks after the first steps
    and again when it changes; the latest one counts. Every field may be unknown (null)."""

    kind: Literal["framework_info"]
    # The batch size the job trains at, and where it was read: "dataloader" (a DataLoader's batch_size that
    # matches the steps' inputs, or the only one seen), "forward_input" (the commonest leading dimension of the
    # model's first input over the steps).
    batch_size: Annotated[int, Strict(), Field(ge=1)] | None = None
    batch_size_source: Literal["dataloader", "forward_input"] | None = None
    model_class: Annotated[str, Field(max_length=500)] | None = None  # module.qualname of the top module
    parameter_count: NonNegInt | None = None
    optimizers: list[Annotated[str, Field(max_length=200)]] | None = Field(default=None, max_length=20)
    # The compute dtype: the autocast dtype when autocast was on in a forward ("autocast"), else the dtype of
    # the model's parameters ("parameters").
    precision: Annotated[str, Field(max_length=50)] | None = None
    precision_source: Literal["autocast", "parameters"] | None = None
    device: Annotated[str, Field(max_length=50)] | None = None  # "cuda:0", "cpu"
    # What the memory figures are measured against: the CUDA device's total memory, or the host's physical
    # memory on a CPU-only run ("host_memory"), whose process RSS is the memory signal there.
    device_memory_total_bytes: NonNegInt | None = None
    device_memory_source: Literal["cuda_device", "host_memory"] | None = None
    # The PYTORCH_CUDA_ALLOC_CONF the process runs with on CUDA ("" = PyTorch's defaults); null on a CPU-only run.
    cuda_alloc_conf: Annotated[str, Field(max_length=500)] | None = None
    # The model's fingerprint (fleetprof/fingerprint.py, the one rule): framework-neutral, so any framework's
    # hooks send the same fields. `fingerprint` is the same for every run of one model and optimizer whatever the
    # batch size, GPU type and count, precision and framework version; the parts say what it was computed from.
    fingerprint: Annotated[str, Field(pattern=FINGERPRINT_PATTERN)] | None = None
    module_tree_hash: Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")] | None = None
    module_count: NonNegInt | None = None
    framework: Annotated[str, Field(max_length=50)] | None = None  # "pytorch", "keras", "jax"
    framework_version: Annotated[str, Field(max_length=100)] | None = None
    # fp32/fp16/bf16/fp64 (the parameters' dtype) or amp_fp16/amp_bf16 (autocast on): `precision` normalized.
    precision_mode: Precision | None = None
    # FLOPs of one training step of this rank (forward, backward, optimizer), counted once on step 1 by
    # torch.utils.flop_counter.FlopCounterMode (issue #20: model FLOPs utilization); its source says how.
    flops_per_step: NonNegFloat | None = None
    flops_per_step_source: Annotated[str, Field(max_length=100)] | None = None


Event = Annotated[
    JobStartEvent | JobEndEvent | StepEvent | LayerEvent | OomEvent | FrameworkInfoEvent, Field(discriminator="kind")
]


class EventBatch(_Strict):
    protocol_version: Literal[1]
    # (source_id, seq) is the idempotency key, as (agent_id, seq) is for samples.
    source_id: Name
    seq: NonNegInt
    sent_at: Timestamp
    events: list[Event] = Field(max_length=100_000)


class IngestAck(BaseModel):
    accepted: int
    duplicate: bool = False
    server_time: float
