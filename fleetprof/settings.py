"""Client-side settings: where the collector is and the token to show it (client commands, the SDK's
`Client.from_settings`, and, inherited, the node agent's AgentSettings).

Environment prefix `FLEETPROF_`; nothing else in `fleetprof/` reads os.environ.
"""

from __future__ import annotations

from typing import Any, TypeVar

from pydantic import Field, ValidationError
from pydantic_settings import BaseSettings, SettingsConfigDict

from fleetprof.errors import CliError


class ClientSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="FLEETPROF_", extra="ignore")

    server_url: str | None = Field(
        default=None, description="collector URL for the agent, `fleetprof run`, the client commands and the SDK")
    token: str | None = Field(default=None, description="API token sent as `Authorization: Bearer`")


class ConnectionUnset(ValueError):
    """The server URL or the token is not set; `option` is the command-line option of the client commands that
    sets it."""

    def __init__(self, message: str, option: str):
        super().__init__(message)
        self.option = option


def connection(settings: ClientSettings) -> tuple[str, str]:
    """(server URL, token), or ConnectionUnset saying which to set."""
    if not settings.server_url:
        raise ConnectionUnset("no server: set FLEETPROF_SERVER_URL (e.g. http://127.0.0.1:8000)", "--server")
    if not settings.token:
        raise ConnectionUnset("no token: set FLEETPROF_TOKEN (create one with `fleetprof token create`)", "--token")
    return settings.server_url, settings.token


S = TypeVar("S", bound=ClientSettings)


def load(cls: type[S], **overrides: Any) -> S:
    """`cls` from the environment, with the overrides that are not None (command-line options) on top. A value that
    does not parse (FLEETPROF_INTERVAL_S=abc) is a one-line CliError naming the variable, not a traceback."""
    try:
        return cls(**{k: v for k, v in overrides.items() if v is not None})
    except ValidationError as exc:
        first = exc.errors()[0]
        name = "FLEETPROF_" + str(first["loc"][0]).upper() if first["loc"] else cls.__name__
        raise CliError(f"invalid setting {name} (or its command-line option) = {first.get('input')!r}: "
                       f"{first['msg']}") from None


def load_client_settings(**overrides: Any) -> ClientSettings:
    """The environment's settings, with the overrides that are not None (command-line options) on top."""
    return load(ClientSettings, **overrides)
