"""The registered models (server-side allow-list of model factories): add, list, remove, and the set an estimate
may import. Services flush; the caller's boundary commits (`fleetprof models`, the estimate request)."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from server.errors import Conflict, InvalidInput, NotFound
from server.estimate.allowlist import ZOO_FACTORIES, RegistrationError, registrable
from server.models import RegisteredModel


def add_model(session: Session, *, factory: str, description: str | None = None) -> RegisteredModel:
    try:
        registrable(factory)
    except RegistrationError as exc:
        raise InvalidInput(str(exc)) from None
    if factory in ZOO_FACTORIES:
        raise Conflict(f"{factory!r} is in the built-in zoo: always allowed, nothing to register")
    if session.scalars(select(RegisteredModel).where(RegisteredModel.factory == factory)).first() is not None:
        raise Conflict(f"{factory!r} is already registered")
    row = RegisteredModel(factory=factory, description=description)
    session.add(row)
    session.flush()
    return row


def list_models(session: Session) -> list[RegisteredModel]:
    return list(session.scalars(select(RegisteredModel).order_by(RegisteredModel.factory)))


def remove_model(session: Session, *, factory: str) -> None:
    row = session.scalars(select(RegisteredModel).where(RegisteredModel.factory == factory)).first()
    if row is None:
        raise NotFound(f"{factory!r} is not registered (see `fleetprof models list`)")
    session.delete(row)
    session.flush()


def registered_factories(session: Session) -> frozenset[str]:
    return frozenset(session.scalars(select(RegisteredModel.factory)))
