"""The Celery application factory (Redis broker). The worker builds its database engine after fork
(server/worker_session.py)."""

from __future__ import annotations

from celery import Celery

from server.config import ServerSettings, get_settings

# Each domain owns its Celery tasks; the worker imports these modules (Celery's `include`), nothing imports it back.
TASK_MODULES = ("server.jobs.tasks", "server.fleet.tasks", "server.storage.tasks")


def create_celery_app(settings: ServerSettings | None = None) -> Celery:
    settings = settings or get_settings()
    if not settings.broker_url:
        raise ValueError("FLEETPROF_BROKER_URL is not set: Celery needs a Redis broker (embedded mode runs tasks "
                         "in-process)")
    app = Celery("fleetprof", broker=settings.broker_url, include=list(TASK_MODULES))
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


celery_app = None


def get_celery_app() -> Celery:
    global celery_app
    if celery_app is None:
        celery_app = create_celery_app()
    return celery_app
