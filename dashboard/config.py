"""Dashboard settings. Env prefix `FLEETPROF_`; nothing else in the dashboard reads os.environ."""

from __future__ import annotations

from pydantic_settings import BaseSettings, SettingsConfigDict


class DashboardSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="FLEETPROF_", extra="ignore")

    server_url: str = "http://127.0.0.1:8000"  # the REST API the dashboard reads everything from
    # A token visitors who have not signed in use. Only for a single-user dashboard on this machine: on a
    # shared dashboard leave it unset, so that each person signs in with their own token.
    token: str | None = None
    dashboard_host: str = "127.0.0.1"  # bind address
    dashboard_port: int = 8050  # port
    dashboard_refresh_s: float = 60.0       # fleet page auto-refresh
    dashboard_api_timeout_s: float = 30.0  # one request to the REST API
