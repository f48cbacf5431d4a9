"""Agent-side settings (node agent, `fleetprof run`, framework hooks, Slurm prolog/epilog).

Environment prefix `FLEETPROF_`; nothing else in `agent/` reads os.environ.
"""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

from pydantic import AliasChoices, Field
from pydantic_settings import SettingsConfigDict

from fleetprof.settings import ClientSettings, load


class AgentSettings(ClientSettings):
    """The client's settings (server_url, token) and the node's own."""

    model_config = SettingsConfigDict(env_prefix="FLEETPROF_", extra="ignore")

    # Set by `fleetprof run` in the child's environment; read by the framework hooks.
    job_id: str | None = None
    team: str | None = None  # team of jobs that `fleetprof run` registers
    node_name: str | None = None  # the agent's node name; unset = the hostname
    interval_s: float = 1.0  # full NVML reading of every GPU, process list and attribution
    fast_interval_s: float = 0.1  # memory used and power only: catches peaks between full samples
    # Power at every fast reading (instantaneous) even where the GPU gives the driver's 1-s mean, which the agent
    # otherwise reads once a second: power_max_w then holds 10 Hz peaks; costs ~0.1 % of a core on 8 GPUs
    power_instant_10hz: bool = False
    spool_dir: Path = Path(".fleetprof/spool")  # durable spool of batches not yet acknowledged
    spool_max_bytes: int = 256 * 1024 * 1024  # past it the oldest batches are dropped and counted
    # Node agent: where samples come from ("nvml", "replay:FILE" as if live, "replay-original:FILE" with the
    # recording's own timestamps; "fake:N" simulates N GPUs for the bench).
    source: str = "nvml"
    # With "replay:FILE": the job the recording's unattributed processes ran for (their pids are not this host's,
    # so /proc cannot say). `fleetprof up` sets it to its demo job.
    replay_job_id: str | None = None
    batch_interval_s: float = 5.0  # a batch is cut and spooled this often: the most a kill -9 of the agent loses
    proc_root: Path = Path("/proc")  # the host's /proc (hostPID in Kubernetes)
    pod_resources_socket: Path = Path("/var/lib/kubelet/pod-resources/kubelet.sock")  # which pod holds which GPU
    ship_backoff_max_s: float = 60.0  # longest wait between retries while the collector is away
    http_timeout_s: float = 10.0  # one request to the collector
    # Node agent: serve this node's GPU gauges for Prometheus at http://HOST:PORT/metrics, under dcgm-exporter's
    # names and labels (docs/guide-operators.md#prometheus); unset = off. Scrape every agent: each GPU's series
    # come from its own node only.
    agent_metrics_port: int | None = Field(default=None, ge=0, le=65535)
    agent_metrics_host: str = "0.0.0.0"  # the address the metrics port listens on
    # Framework hooks: "off" | "default" (steps, allocator peaks, per-module timing every
    # `hooks_layer_every`-th step) | "layers" (per-module timing on every step: more detail, more overhead)
    hooks_level: str = "default"
    hooks_layer_every: int = 100  # per-module timing every N-th step at hooks level "default"
    # Count one step's FLOPs (step 1, torch.utils.flop_counter) for the report's MFU; false: never
    hooks_flop_count: bool = True
    # Set by `fleetprof run --trace-allocator N` for the hooks: CUDA allocator trace of steps 1..N, uploaded as a
    # snapshot; 0 = off
    hooks_alloc_trace_steps: int = 0
    # Set by `fleetprof run --profile N` for the hooks: torch.profiler (Kineto) trace of steps 1..N, uploaded and
    # analyzed; 0 = off
    hooks_profile_steps: int = 0
    # Hooks: seconds between polls for live capture requests (issue #19: a Kineto or allocator trace of the next K
    # steps, asked for through the API while the job runs); 0 = off
    hooks_capture_poll_s: float = 10.0
    # Inside a Slurm allocation (Slurm's own variable, not ours): `fleetprof run` takes slurm:<id> as its job id.
    slurm_job_id: str | None = Field(default=None, validation_alias=AliasChoices("SLURM_JOB_ID", "slurm_job_id"))
    # `fleetprof slurm epilog`: the token its summary reads the report with (a scheduler token: agent tokens write
    # but cannot read reports); default FLEETPROF_TOKEN.
    slurm_report_token: str | None = None
    # The dashboard's URL: the Slurm summary and `fleetprof run`'s summary link to the job's page there (unset: to
    # the API's HTML report).
    dashboard_url: str | None = None


def load_settings(**overrides: Any) -> AgentSettings:
    """The environment's agent settings, the overrides that are not None on top (fleetprof.settings.load)."""
    return load(AgentSettings, **overrides)


def node_name(settings: AgentSettings) -> str:
    """The name this node reports as: FLEETPROF_NODE_NAME, else the host name (agent, Slurm prolog/epilog)."""
    return settings.node_name or socket.gethostname()
