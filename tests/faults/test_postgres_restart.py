"""Fault: the database goes away mid-ingest (immediate shutdown = crash + WAL recovery) and comes back.

Real processes: a private Postgres cluster, a `fleetprof server` collector, and the real `fleetprof agent`
(4 simulated GPUs, under the journaling wrapper) shipping continuously, plus a sender thread posting
1,000-sample batches back to back so that commits are in flight when the database dies.

Proves: while Postgres is down the collector answers 503 with Retry-After (never 500) to the agent and to the
sender, /readyz says 503; the agent keeps its batches spooled and retries; after the restart every
batch the collector acknowledged is stored, and every sample exactly once (per (gpu, ts) and in the
idempotency ledger); the agent drains its spool completely.
"""

from __future__ import annotations

import time
from collections import Counter

import pytest

from tests.faults.harness import (
    JournalView,
    Sender,
    assert_exactly_once,
    base_env,
    create_token,
    http_status,
    start_agent,
    start_collector,
    stop_agent_and_drain,
    wait_until,
)


@pytest.mark.slow
def test_postgres_restart_mid_ingest(private_pg, fault_db, procs, tmp_path):
    t_begin = time.monotonic()
    env = base_env(fault_db, tmp_path)
    agent_token = create_token(env, "agent", node="*")
    collector, url = start_collector(procs, env, tmp_path)
    agent = start_agent(procs, env, tmp_path, server=url, token=agent_token, node="pg-node", gpus=4,
                        interval_s=0.1, batch_interval_s=0.3)
    journal = agent.extra["journal"]
    wait_until(lambda: len(JournalView.read(journal).acked) >= 5, 30, "the agent's first acknowledged batches")

    # A second client beside the agent: a sender posting 1,000-sample batches back to back (so that commits
    # are in flight when Postgres dies), retrying each batch until acknowledged, recording every answer.
    sender = Sender(url, agent_token)
    sender.start()
    wait_until(lambda: sender.acked >= 3, 20, "the sender's first acknowledgements")

    acked_before = len(JournalView.read(journal).acked)
    t_down = time.monotonic()
    private_pg.stop("immediate")  # a crash: no shutdown checkpoint, recovery replays the WAL on start
    time.sleep(2.0)
    ready, ready_headers = http_status("GET", url + "/readyz")
    time.sleep(2.0)
    answers_during = len(sender.answers)
    private_pg.start()
    outage_s = time.monotonic() - t_down

    assert ready == 503 and ready_headers is not None and "Retry-After" in ready_headers
    # The agent comes back by itself and catches up.
    wait_until(lambda: len(JournalView.read(journal).acked) >= acked_before + 10, 40,
               "acknowledgements after Postgres came back")
    t_recovered = time.monotonic()
    sender_acked_at_recovery = sender.acked
    wait_until(lambda: sender.acked >= sender_acked_at_recovery + 2, 20, "the sender's acknowledgements")
    sender.stop()
    answers = Counter(status for status, _ in sender.answers)
    assert answers_during > 0
    # Only 200 and 503 (None: a client-side timeout, tolerated on an overloaded test machine; never a 500).
    assert set(answers) <= {200, 503, None}, f"the collector answered the sender {answers}"
    assert answers[503] > 0, "the sender never saw the outage"
    assert all(ra is not None and float(ra) > 0 for status, ra in sender.answers if status == 503), \
        "503 without Retry-After"
    restarts = stop_agent_and_drain(procs, agent)  # SIGTERM; a restart on the same spool delivers what is left
    view = JournalView.read(journal)

    statuses = view.error_statuses()
    assert statuses[503] > 0, f"the agent never saw a 503: {statuses}"
    assert set(statuses) <= {503, None}, f"the agent saw other failures than 503: {statuses}"
    assert "Traceback" not in collector.log(), collector.log()[-3000:]
    figures = assert_exactly_once(fault_db, view)
    sender.assert_exactly_once(fault_db)
    assert collector.alive()
    print(f"\npostgres outage {outage_s:.1f} s; agent saw {dict(statuses)}, sender saw {dict(answers)} "
          f"({sender.acked} batches x 1000 samples acknowledged, {sender.duplicates} as duplicates); agent "
          f"recovered {t_recovered - t_down:.1f} s after the stop; agent {figures}, {restarts} agent restart(s) to "
          f"drain the spool; "
          f"test {time.monotonic() - t_begin:.1f} s")

