"""Server-side settings (collector, REST API, workers). Env prefix `FLEETPROF_`; nothing else reads os.environ."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Annotated

from pydantic import Field, ValidationError, field_validator, model_validator
from pydantic_core import ErrorDetails
from pydantic_settings import BaseSettings, SettingsConfigDict

from fleetprof.errors import CliError
from server import urls

EMBEDDED_DIR = Path(".fleetprof")


class ServerSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="FLEETPROF_", extra="ignore")

    # Unset = embedded mode: SQLite under ./.fleetprof/ and tasks run in-process.
    database_url: str | None = None
    broker_url: str | None = None  # Redis URL of the Celery broker; unset = tasks run in-process
    # Celery queue and Redis key prefix: lets several deployments (or test sessions) share one Redis.
    queue_name: str = "fleetprof"
    data_dir: Path = EMBEDDED_DIR  # embedded database, uploaded trace blobs (shared by all collectors/workers)
    environment: str = "development"  # "production" refuses to start without FLEETPROF_DATABASE_URL

    max_body_bytes: int = 16 * 1024 * 1024          # compressed request body
    max_decompressed_bytes: int = 128 * 1024 * 1024  # after gunzip (zip-bomb guard)
    max_trace_bytes: int = 512 * 1024 * 1024         # decompressed trace JSON
    max_trace_upload_bytes: int = 256 * 1024 * 1024  # trace upload body as sent (often gzip)
    max_future_skew_s: float = 86_400.0              # samples from further in the future are rejected
    max_inflight_ingest: int = 64                    # concurrent ingest requests before 503 + Retry-After
    ingest_timeout_s: float = 30.0                   # wait for the group commit before answering 503
    ingest_writers: int = 2                          # group-commit writer threads (database connections)
    # Per-token rate limit (token bucket, per collector process; 0 disables): sustained requests/s and burst.
    # Generous by default: `fleetprof replay` and a shared '*' agent token send batches back to back.
    rate_limit_per_s: float = 100.0
    rate_limit_burst: int = 1000  # requests a token may send at once before the sustained rate applies

    characterize_running_every_s: float = 60.0  # running jobs' reports are recomputed this often
    # A running job whose GPU processes the agents attributed to it has not been seen for this long is ended by
    # the server (state "lost"; server.jobs.unseen); 0 never ends one. Above the agent's batch interval and the
    # pauses training makes off the GPU (checkpoints, evaluation on CPU); a job seen again runs again.
    job_unseen_timeout_s: float = 900.0
    raw_retention_days: int = 30                     # raw samples older than this are dropped (rollups kept)
    # GET /metrics/fleet (scraped once per fleet) also carries every GPU's latest stored sample under
    # dcgm-exporter's names, as /metrics did before issue #20: for fleets whose agents Prometheus cannot reach.
    # Off by default: the agents serve those series themselves (FLEETPROF_AGENT_METRICS_PORT), and both on would
    # give each GPU two series.
    fleet_metrics_gpu_gauges: bool = False
    estimate_timeout_s: float = 120.0                # hard ceiling for one pre-training estimate
    estimate_cpu_s: float = 120.0                    # the estimate sandbox's CPU time limit (RLIMIT_CPU)
    estimate_memory_bytes: int = 8 * 1024**3         # the estimate sandbox's address space (RLIMIT_AS)
    grid_intensity_g_per_kwh: float = 400.0  # grid carbon intensity for CO2e (g per facility kWh)
    pue: float = 1.2  # power usage effectiveness: facility kWh = GPU kWh x PUE
    price_per_kwh_usd: float = 0.12  # electricity price for a report's cost (per facility kWh)

    # Automatic captures (server.captures.auto): when the median of a rank's last `capture_recent_steps` steps
    # exceeds `capture_slowdown_factor` x its baseline (the median of `capture_baseline_steps` steps after
    # `capture_warmup_steps` of warm-up), a kineto capture of `capture_auto_steps` steps is requested, at most one
    # per job per `capture_min_interval_s`. `capture_auto` false turns the check off.
    capture_auto: bool = True
    capture_warmup_steps: Annotated[int, Field(ge=0)] = 10  # steps skipped before the baseline
    capture_baseline_steps: Annotated[int, Field(ge=1)] = 50  # steps whose median is the baseline
    capture_recent_steps: Annotated[int, Field(ge=1)] = 20  # latest steps compared with it
    capture_slowdown_factor: Annotated[float, Field(gt=1.0)] = 1.5  # recent / baseline median that fires
    capture_min_interval_s: Annotated[float, Field(ge=0.0)] = 3600.0  # at most one automatic capture a job per this
    capture_auto_steps: Annotated[int, Field(ge=1, le=100)] = 5  # steps an automatic capture traces

    @field_validator("database_url", mode="after")
    @classmethod
    def _database_url(cls, url: str | None) -> str | None:
        # Empty means unset (embedded), as with every other FLEETPROF_ variable left blank in a unit or compose file.
        return urls.database_url(url) if url and url.strip() else None

    @field_validator("broker_url", mode="after")
    @classmethod
    def _broker_url(cls, url: str | None) -> str | None:
        return urls.broker_url(url) if url and url.strip() else None

    @property
    def embedded(self) -> bool:
        return self.database_url is None

    @property
    def sqlalchemy_url(self) -> str:
        """The database URL in SQLAlchemy's form (normalised by server.urls when the settings were read)."""
        if self.database_url:
            return self.database_url
        return f"sqlite:///{(self.data_dir / 'fleetprof.db').resolve()}"

    @property
    def blob_dir(self) -> Path:
        return self.data_dir / "blobs"

    @model_validator(mode="after")
    def _refuse_unsafe_production(self) -> ServerSettings:
        if self.environment == "production" and self.embedded:
            raise ValueError("FLEETPROF_DATABASE_URL must be set when FLEETPROF_ENVIRONMENT=production")
        return self


class SettingsError(CliError):
    """The environment's settings are unusable; one line per setting, never the value (a URL carries passwords)."""


@lru_cache(maxsize=1)
def get_settings() -> ServerSettings:
    try:
        return ServerSettings()
    except ValidationError as exc:
        raise SettingsError("; ".join(_describe(e) for e in exc.errors())) from None


def _describe(error: ErrorDetails) -> str:
    """One setting's problem as `FLEETPROF_NAME: reason`, without pydantic's echo of the input."""
    cause = error.get("ctx", {}).get("error")
    reason = str(cause) if cause is not None else error["msg"]
    names = [str(part) for part in error.get("loc", ()) if part != "__root__"]
    return f"FLEETPROF_{names[0].upper()}: {reason}" if names else reason
