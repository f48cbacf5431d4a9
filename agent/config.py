"""Agent-side settings (node agent, `fleetprof run`, framework hooks, client commands).

Environment prefix `FLEETPROF_`; nothing else in `agent/` reads os.environ.
"""

from __future__ import annotations

import socket
from pathlib import Path

from pydantic import AliasChoices, Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class AgentSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="FLEETPROF_", extra="ignore")

    server_url: str | None = None
    token: str | None = None
    # Set by `fleetprof run` in the child's environment; read by the framework hooks.
    job_id: str | None = None
    team: str | None = None
    node_name: str | None = None
    interval_s: float = 1.0
    fast_interval_s: float = 0.1
    spool_dir: Path = Path(".fleetprof/spool")
    spool_max_bytes: int = 256 * 1024 * 1024
    # Node agent: where samples come from ("nvml", "replay:FILE" as if live, "replay-original:FILE" with the
    # recording's own timestamps; "fake:N" simulates N GPUs for the bench),
    # how often a batch is cut and spooled (what a kill -9 of the agent itself can lose at most), the host's
    # /proc (hostPID in Kubernetes) and the kubelet pod-resources socket used for job attribution.
    source: str = "nvml"
    # With "replay:FILE": the job the recording's unattributed processes ran for (their pids are not this host's,
    # so /proc cannot say). `fleetprof up` sets it to its demo job.
    replay_job_id: str | None = None
    batch_interval_s: float = 5.0
    proc_root: Path = Path("/proc")
    pod_resources_socket: Path = Path("/var/lib/kubelet/pod-resources/kubelet.sock")
    ship_backoff_max_s: float = 60.0
    http_timeout_s: float = 10.0
    # Framework hooks: "off" | "default" (steps, allocator peaks, per-module timing every
    # `hooks_layer_every`-th step) | "layers" (per-module timing on every step: more detail, more overhead)
    hooks_level: str = "default"
    hooks_layer_every: int = 100
    hooks_alloc_trace_steps: int = 0
    # Inside a Slurm allocation (Slurm's own variable, not ours): `fleetprof run` takes slurm:<id> as its job id.
    slurm_job_id: str | None = Field(default=None, validation_alias=AliasChoices("SLURM_JOB_ID", "slurm_job_id"))
    # `fleetprof slurm epilog`: the token its summary reads the report with (a scheduler token: agent tokens write
    # but cannot read reports); default FLEETPROF_TOKEN. The dashboard's URL, for the summary's link to the job.
    slurm_report_token: str | None = None
    dashboard_url: str | None = None


def load_settings(**overrides: object) -> AgentSettings:
    return AgentSettings(**{k: v for k, v in overrides.items() if v is not None})


def node_name(settings: AgentSettings) -> str:
    """The name this node reports as: FLEETPROF_NODE_NAME, else the host name (agent, Slurm prolog/epilog)."""
    return settings.node_name or socket.gethostname()
