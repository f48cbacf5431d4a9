"""Fault: Postgres hangs (every server process SIGSTOPped: a frozen VM, a stalled disk, a network black hole)
for 8 s mid-ingest, then resumes.

Real processes: a private Postgres, a `fleetprof server` collector and the real `fleetprof agent` (journaling
wrapper, 5-s HTTP timeout).

Proves: nothing is lost or duplicated when requests hang instead of failing: batches whose commit completed
after the agent had given up waiting are resent and answered as duplicates, never stored twice; the agent
drains its spool after the freeze; /healthz (liveness) keeps answering, so an orchestrator does not restart
healthy collectors because their database hangs.
Known gap (imperative xfail at the end, after everything above passed): the collector has no client-side
deadline on database calls, so during the freeze /readyz and ingest hang until the client's own timeout
instead of answering 503 + Retry-After.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time

import pytest

from tests.faults.harness import (
    JournalView,
    assert_exactly_once,
    base_env,
    create_token,
    http_status,
    start_agent,
    start_collector,
    stop_agent_and_drain,
    wait_until,
)

FREEZE_S = 8.0


def postgres_pids(data_dir) -> list[int]:  # type: ignore[no-untyped-def]
    """The postmaster of this cluster (pid in postmaster.pid) and all its children."""
    postmaster = int((data_dir / "postmaster.pid").read_text().split()[0])
    out = subprocess.run(["pgrep", "-P", str(postmaster)], capture_output=True, text=True, check=False).stdout
    return [postmaster, *(int(p) for p in out.split())]


@pytest.mark.slow
def test_postgres_frozen_mid_ingest_no_loss_no_duplicate(private_pg, fault_db, procs, tmp_path):
    t_begin = time.monotonic()
    env = base_env(fault_db, tmp_path)
    token = create_token(env, "agent", node="*")
    collector, url = start_collector(procs, env, tmp_path)
    agent = start_agent(procs, env, tmp_path, server=url, token=token, node="frozen-node", gpus=4)
    journal = agent.extra["journal"]
    wait_until(lambda: len(JournalView.read(journal).acked) >= 5, 30, "the agent's first acknowledgements")

    pids = postgres_pids(private_pg.data)
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
    t_freeze = time.monotonic()
    live, ready = [], []
    try:
        while time.monotonic() - t_freeze < FREEZE_S:
            live.append(http_status("GET", url + "/healthz", timeout=2)[0])
            ready.append(http_status("GET", url + "/readyz", timeout=3)[0])
            time.sleep(0.5)
    finally:
        for pid in pids:
            os.kill(pid, signal.SIGCONT)
    acked_at_thaw = len(JournalView.read(journal).acked)
    wait_until(lambda: len(JournalView.read(journal).acked) >= acked_at_thaw + 10, 40, "acks after the thaw")
    restarts = stop_agent_and_drain(procs, agent)
    view = JournalView.read(journal)
    figures = assert_exactly_once(fault_db, view)
    assert set(view.error_statuses()) <= {None, 503}, view.error_statuses()
    assert live and all(s == 200 for s in live), f"/healthz during the freeze: {live}"
    assert collector.alive()
    print(f"\npostgres frozen {FREEZE_S:.0f} s; agent errors {dict(view.error_statuses())}; /readyz answers during "
          f"the freeze {ready}; agent {figures}, {restarts} restart(s) to drain; test "
          f"{time.monotonic() - t_begin:.1f} s")
    if any(s is None for s in ready):
        pytest.xfail("while Postgres hangs, /readyz (and ingest) hang until the client times out instead of "
                     "answering 503: server/db.py sets no connect_timeout, TCP keepalives or pool_timeout, and "
                     "the request path has no deadline on database calls")
