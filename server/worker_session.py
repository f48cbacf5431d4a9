"""The Celery worker process's sessionmaker, built lazily after fork (never shared across processes).

Below the domains: each domain's tasks (`server/<domain>/tasks.py`) take their sessions from here, and the Celery
app (`server/worker.py`) names those task modules without the tasks importing it back.
"""

from __future__ import annotations

from celery.signals import worker_process_init
from sqlalchemy.orm import Session, sessionmaker

from server.config import get_settings
from server.db import make_engine, make_sessionmaker

_state: dict[str, sessionmaker[Session]] = {}


def session_factory() -> sessionmaker[Session]:
    if "factory" not in _state:
        _state["factory"] = make_sessionmaker(make_engine(get_settings()))
    return _state["factory"]


@worker_process_init.connect
def _reset_after_fork(**_: object) -> None:
    _state.clear()
