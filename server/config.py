"""Server-side settings (collector, REST API, workers). Env prefix `FLEETPROF_`; nothing else reads os.environ."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from pydantic import model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

EMBEDDED_DIR = Path(".fleetprof")


class ServerSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="FLEETPROF_", extra="ignore")

    # Unset = embedded mode: SQLite under ./.fleetprof/ and tasks run in-process.
    database_url: str | None = None
    broker_url: str | None = None
    # Celery queue and Redis key prefix: lets several deployments (or test sessions) share one Redis.
    queue_name: str = "fleetprof"
    data_dir: Path = EMBEDDED_DIR
    environment: str = "development"

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
    rate_limit_burst: int = 1000

    characterize_running_every_s: float = 60.0
    raw_retention_days: int = 30                     # raw samples older than this are dropped (rollups kept)
    estimate_timeout_s: float = 120.0                # hard ceiling for one pre-training estimate
    estimate_cpu_s: float = 120.0                    # the estimate sandbox's CPU time limit (RLIMIT_CPU)
    estimate_memory_bytes: int = 8 * 1024**3         # the estimate sandbox's address space (RLIMIT_AS)
    grid_intensity_g_per_kwh: float = 400.0
    pue: float = 1.2
    price_per_kwh_usd: float = 0.12

    @property
    def embedded(self) -> bool:
        return self.database_url is None

    @property
    def sqlalchemy_url(self) -> str:
        if self.database_url:
            url = self.database_url
            return url.replace("postgres://", "postgresql+psycopg2://", 1) if url.startswith("postgres://") else url
        return f"sqlite:///{(self.data_dir / 'fleetprof.db').resolve()}"

    @property
    def blob_dir(self) -> Path:
        return self.data_dir / "blobs"

    @model_validator(mode="after")
    def _refuse_unsafe_production(self) -> ServerSettings:
        if self.environment == "production" and self.embedded:
            raise ValueError("FLEETPROF_DATABASE_URL must be set when FLEETPROF_ENVIRONMENT=production")
        return self


@lru_cache(maxsize=1)
def get_settings() -> ServerSettings:
    return ServerSettings()
