"""Fault: the collector is killed with SIGKILL mid-ingest, stays down a while, and is started again.

Real processes: a private Postgres, a `fleetprof server` collector, the real `fleetprof agent` (journaling
wrapper) and a sender thread posting 1,000-sample batches back to back (so a request is in flight, possibly
already committed, when the collector dies).

Proves: while the collector is gone the agent keeps sampling into its durable spool (batches spooled, none
acknowledged), then delivers everything after the restart; every acknowledged sample is stored exactly once
(a batch committed whose acknowledgement died with the collector is resent and answered as a duplicate, never
stored twice); the agent's spool ends empty.
"""

from __future__ import annotations

import time

import pytest

from tests.faults.harness import (
    JournalView,
    Sender,
    assert_exactly_once,
    base_env,
    create_token,
    start_agent,
    start_collector,
    stop_agent_and_drain,
    wait_until,
)


@pytest.mark.slow
def test_collector_killed_agents_spool_and_deliver_once(fault_db, procs, tmp_path):
    t_begin = time.monotonic()
    env = base_env(fault_db, tmp_path)
    agent_token = create_token(env, "agent", node="*")
    collector, url = start_collector(procs, env, tmp_path)
    port = int(url.rsplit(":", 1)[1])
    agent = start_agent(procs, env, tmp_path, server=url, token=agent_token, node="kill-node", gpus=4,
                        interval_s=0.1, batch_interval_s=0.3)
    journal = agent.extra["journal"]
    sender = Sender(url, agent_token)
    sender.start()
    wait_until(lambda: len(JournalView.read(journal).acked) >= 5 and sender.acked >= 3, 30,
               "first acknowledgements")

    t_kill = time.monotonic()
    collector.kill9()
    time.sleep(4.0)
    during = JournalView.read(journal)
    waiting = [key for key in during.spooled if key not in during.acked]
    collector2, _ = start_collector(procs, env, tmp_path, port=port, name="collector2")
    down_s = time.monotonic() - t_kill

    # Sampling went on into the spool while nobody listened; the shipper saw connection errors.
    assert len(waiting) >= 5, f"only {len(waiting)} batches waited in the spool during the outage"
    assert None in during.error_statuses(), "the agent never failed to connect"

    # Everything spooled before the restart gets acknowledged afterwards.
    wait_until(lambda: all(k in JournalView.read(journal).acked for k in waiting), 40,
               "the spool to drain after the restart")
    t_drained = time.monotonic()
    sent_before = sender.acked
    wait_until(lambda: sender.acked >= sent_before + 2, 20, "the sender after the restart")
    sender.stop()
    restarts = stop_agent_and_drain(procs, agent)  # SIGTERM; a restart on the same spool delivers what is left
    view = JournalView.read(journal)
    assert set(view.error_statuses()) <= {None, 503}, view.error_statuses()
    figures = assert_exactly_once(fault_db, view)
    sender.assert_exactly_once(fault_db)
    assert collector2.alive()
    print(f"\ncollector down {down_s:.1f} s; {len(waiting)} agent batches spooled meanwhile, drained "
          f"{t_drained - t_kill - down_s:.1f} s after the restart; sender {sender.acked} batches acked "
          f"({sender.duplicates} as duplicates); agent {figures}, {restarts} agent restart(s) to drain the spool; "
          f"test {time.monotonic() - t_begin:.1f} s")
