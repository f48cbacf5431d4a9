"""The Celery application factory (Redis broker). The worker builds its database engine after fork."""

from __future__ import annotations

from celery import Celery
from celery.signals import worker_process_init

from server.config import ServerSettings, get_settings

_state: dict[str, object] = {}


def create_celery_app(settings: ServerSettings | None = None) -> Celery:
    settings = settings or get_settings()
    if not settings.broker_url:
        raise ValueError("FLEETPROF_BROKER_URL is not set: Celery needs a Redis broker (embedded mode runs tasks "
                         "in-process)")
    app = Celery("fleetprof", broker=settings.broker_url, include=["server.tasks"])
    app.conf.update(
        task_default_queue=settings.queue_name,
        task_acks_late=True,                 # a worker killed mid-task leaves the task for another worker
        task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=1,
        task_ignore_result=True,
        broker_connection_retry_on_startup=True,
        broker_transport_options={"global_keyprefix": f"{settings.queue_name}:", "visibility_timeout": 600},
        beat_schedule={
            "characterize-due": {"task": "fleetprof.characterize_due",
                                 "schedule": settings.characterize_running_every_s},
            "rollup-recent": {"task": "fleetprof.rollup_recent", "schedule": 300.0},
            "storage-maintenance": {"task": "fleetprof.storage_maintenance", "schedule": 3600.0},
        },
    )
    app.conf.fleetprof_settings = settings
    return app


def session_factory():
    """The worker process's sessionmaker, built lazily after fork (never shared across processes)."""
    if "factory" not in _state:
        from server.db import make_engine, make_sessionmaker

        _state["factory"] = make_sessionmaker(make_engine(get_settings()))
    return _state["factory"]


@worker_process_init.connect
def _reset_after_fork(**_: object) -> None:
    _state.clear()


celery_app = None


def get_celery_app() -> Celery:
    global celery_app
    if celery_app is None:
        celery_app = create_celery_app()
    return celery_app
