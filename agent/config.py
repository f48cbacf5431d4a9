"""Agent-side settings (node agent, `fleetprof run`, framework hooks, client commands).

Environment prefix `FLEETPROF_`; nothing else in `agent/` reads os.environ.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

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


def load_settings(**overrides: Any) -> AgentSettings:
    return AgentSettings(**{k: v for k, v in overrides.items() if v is not None})
