"""Where background work runs (server/dispatch.py): the dispatcher is handed the task's name or body by the app, and
neither a broker outage nor a failing body reaches the caller (ingest must not fail because a task could not run)."""

from __future__ import annotations

import logging
import threading

import pytest

from server.dispatch import CeleryDispatcher, InProcessDispatcher


class _Broker:
    def __init__(self, fail: bool = False):
        self.sent: list[tuple[str, list[int]]] = []
        self.fail = fail

    def send_task(self, name: str, args: list[int]) -> None:
        if self.fail:
            raise ConnectionError("broker down")
        self.sent.append((name, args))


def test_celery_dispatcher_sends_the_name_it_was_given() -> None:
    broker = _Broker()
    CeleryDispatcher(broker, characterize_task="fleetprof.characterize_job").characterize(7)
    assert broker.sent == [("fleetprof.characterize_job", [7])]


def test_celery_dispatcher_survives_a_broker_outage(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="server.dispatch"):
        CeleryDispatcher(_Broker(fail=True), characterize_task="fleetprof.characterize_job").characterize(7)
    assert "job 7 deferred" in caplog.text


def test_in_process_dispatcher_runs_bodies_in_order_off_the_caller_thread(caplog: pytest.LogCaptureFixture) -> None:
    ran: list[tuple[int, str]] = []
    last_done = threading.Event()

    def body(job_pk: int) -> bool:
        ran.append((job_pk, threading.current_thread().name))
        if job_pk == 3:
            last_done.set()
        if job_pk == 2:
            raise RuntimeError("analysis failed")
        return True

    dispatcher = InProcessDispatcher(characterize=body)
    with caplog.at_level(logging.ERROR, logger="server.dispatch"):
        for pk in (1, 2, 3):
            dispatcher.characterize(pk)
        assert last_done.wait(10)
        dispatcher.close()
    assert [pk for pk, _ in ran] == [1, 2, 3]  # a failing body does not stop the next
    assert all(name.startswith("fleetprof-task") for _, name in ran)
    assert "characterization of job 2 failed" in caplog.text
