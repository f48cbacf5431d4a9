"""FastAPI dependencies, declared once as Annotated aliases."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated

from fastapi import Depends, Query, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.security import HTTPBearer
from sqlalchemy.orm import Session

from server.auth.service import Principal, authenticate, bearer_digest, require_scope
from server.config import ServerSettings
from server.db import session_scope
from server.dispatch import Dispatcher


def get_session(request: Request) -> Iterator[Session]:
    """One session per request; the request boundary commits (services only flush)."""
    with session_scope(request.app.state.sessionmaker) as session:
        yield session


# scope="function": the commit happens when the route returns, before the response is sent. FastAPI's default
# commits after sending: a client could read its 200 and ask again before the write was visible (the fuzz seed
# did, and its next request, blocked on the uncommitted row, held the event loop the commit was waiting for), and
# a failed commit would follow a 200.
SessionDep = Annotated[Session, Depends(get_session, scope="function")]


# Dependencies that do no I/O are `async def`: FastAPI runs a plain `def` dependency in the thread pool, a
# thread hop per dependency per request, which on the ingest path cost more CPU than the ingest itself.


async def get_settings_dep(request: Request) -> ServerSettings:
    return request.app.state.settings


SettingsDep = Annotated[ServerSettings, Depends(get_settings_dep)]


async def get_dispatcher(request: Request) -> Dispatcher:
    return request.app.state.dispatcher


DispatcherDep = Annotated[Dispatcher, Depends(get_dispatcher)]


async def resolve_principal(request: Request, authorization: str | None) -> Principal:
    """The token's principal: from the cache on the event loop (the common case), else looked up in a thread."""
    digest = bearer_digest(authorization)
    cache = request.app.state.token_cache
    if (hit := cache.get(digest)) is not None:
        return hit

    def lookup() -> Principal:
        # A short-lived session of its own: authentication must not hold the request's transaction open.
        with request.app.state.sessionmaker() as session:
            return authenticate(session, digest, cache)

    return await run_in_threadpool(lookup)


class BearerScheme(HTTPBearer):
    """The `Authorization: Bearer <token>` scheme, declared so that OpenAPI has it (`components.securitySchemes`,
    each protected operation's `security`, Swagger's Authorize button). It hands on the raw header: the checks and
    their 401s stay in `bearer_digest`, the one rule the ingest fast path applies too (HTTPBearer's own would
    answer a malformed header differently from a missing one)."""

    async def __call__(self, request: Request) -> str | None:  # type: ignore[override]
        return request.headers.get("authorization")


BEARER = BearerScheme(scheme_name="bearer", bearerFormat="fp_…", auto_error=False,
                      description="A token from `fleetprof token create`, sent as `Authorization: Bearer <token>`.")


async def get_principal(request: Request, authorization: Annotated[str | None, Depends(BEARER)]) -> Principal:
    return await resolve_principal(request, authorization)


PrincipalDep = Annotated[Principal, Depends(get_principal)]


def _scoped(*scopes: str):
    async def dep(principal: PrincipalDep) -> Principal:
        return require_scope(principal, *scopes)

    return Depends(dep)


AgentAuth = Annotated[Principal, _scoped("agent")]
EventWriterAuth = Annotated[Principal, _scoped("agent", "team")]
JobReaderAuth = Annotated[Principal, _scoped("team", "scheduler")]
SchedulerAuth = Annotated[Principal, _scoped("team", "scheduler")]
OperatorAuth = Annotated[Principal, _scoped()]
# Live captures (POST/GET .../captures): a team on its own jobs, operators on any
CaptureAuth = Annotated[Principal, _scoped("team")]


# Times in query strings (`since`, `until`): seconds since epoch (UTC), finite and at most 1e11 (year 5138), checked
# here for every route: nan, inf or 1e20 once reached datetime arithmetic and answered 500.
MAX_QUERY_EPOCH_S = 1e11
EpochQuery = Annotated[float | None, Query(ge=0, le=MAX_QUERY_EPOCH_S, allow_inf_nan=False,
                                           description="seconds since epoch (UTC)")]
