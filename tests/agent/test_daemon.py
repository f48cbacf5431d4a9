"""The whole agent: devices -> sampler -> spool -> shipper -> collector double, across outages and restarts."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from agent.config import AgentSettings
from agent.daemon import SLEEP_MAX_S, Agent, SourceError, open_devices, run_agent, wait_until
from agent.devices.nvml import NvmlDevices
from tests.agent.collector import Collector
from tests.agent.conftest import make_fake

SMI_CAPTURE = "nvidia-smi/linux-x86_64__nvidia-h100-80gb-hbm3__590.48.01.txt"


def settings(tmp_path: Path, collector: Collector, **kw: object) -> AgentSettings:
    base: dict[str, object] = dict(server_url=collector.url, token="tok", spool_dir=tmp_path / "spool",
                                   interval_s=0.05, fast_interval_s=0.01, batch_interval_s=0.1,
                                   ship_backoff_max_s=0.1, node_name="node-a", http_timeout_s=2.0)
    base.update(kw)
    return AgentSettings(**base)  # type: ignore[arg-type]


def run_for(agent: Agent, seconds: float, during: object = None) -> None:
    stop = threading.Event()
    t = threading.Thread(target=agent.run, args=(stop,))
    t.start()
    try:
        time.sleep(seconds)
        if callable(during):
            during()
    finally:
        stop.set()
        t.join(10)
    assert not t.is_alive()


def test_outage_and_restart_deliver_every_sample_exactly_once(tmp_path: Path, collector: Collector) -> None:
    s = settings(tmp_path, collector)
    collector.down()
    first = Agent(s, NvmlDevices(make_fake(2)))
    run_for(first, 0.6)  # the collector never answered: everything stays spooled
    assert first.samples_spooled > 0 and not collector.batches

    collector.up()
    second = Agent(s, NvmlDevices(make_fake(2)))

    def outage() -> None:
        collector.down()
        time.sleep(0.5)
        collector.up()
        time.sleep(0.5)

    run_for(second, 0.3, during=outage)
    rows = collector.rows()
    assert len(rows) == len(set(rows)) == first.samples_spooled + second.samples_spooled
    assert {agent for agent, _ in collector.batches} == {first.agent_id, second.agent_id}
    last = max(collector.batches.values(), key=lambda b: (b.agent_id == second.agent_id, b.seq))
    assert last.clock_skew_s is not None and abs(last.clock_skew_s) < 1.0
    assert len(second.spool) == 0


def test_replay_source_runs_as_if_live(tmp_path: Path, collector: Collector, real_data: Path) -> None:
    stop = threading.Event()
    t = threading.Thread(target=run_agent, args=(settings(tmp_path, collector),),
                         kwargs={"source": f"replay:{real_data / SMI_CAPTURE}", "stop": stop})
    t.start()
    try:
        assert collector.wait_for(lambda: len(collector.rows()) >= 3)
    finally:
        stop.set()
        t.join(10)
    b = next(iter(collector.batches.values()))
    assert b.source == "replay" and b.gpus[0].name == "NVIDIA H100 80GB HBM3"
    assert b.gpus[0].power_source == "nvidia-smi:power.draw"
    assert b.samples.power_w and b.samples.power_w[0] == pytest.approx(69.85)
    assert b.samples.memory_total_bytes == [85_520_809_984] * len(b.samples)


def test_unknown_sources_are_refused() -> None:
    for bad in ("cuda", "replay:", "fake:x", "replay:/nonexistent/file.csv"):
        with pytest.raises(SourceError):
            open_devices(bad)


def test_cli_agent_stops_cleanly_on_sigterm(tmp_path: Path, collector: Collector, real_data: Path,
                                            repo_root: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(repo_root), "FLEETPROF_INTERVAL_S": "0.1",
           "FLEETPROF_BATCH_INTERVAL_S": "0.2"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "fleetprof.cli", "agent", "--server", collector.url, "--token", "t",
         "--source", f"replay:{real_data / SMI_CAPTURE}", "--spool", str(tmp_path / "spool"), "--node", "cli-node"],
        cwd=repo_root, env=env, stderr=subprocess.PIPE, text=True)
    try:
        assert collector.wait_for(lambda: len(collector.batches) >= 2, timeout_s=20)
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=20)
    assert proc.returncode == 0, err
    assert all(b.node == "cli-node" for b in collector.batches.values())
    assert "stopping" in err


def test_wait_until_sleeps_short_waits_and_ends_long_ones_on_stop() -> None:
    """The sampling loop's wait: a short one is a plain sleep of its length (cheaper per wake-up than a timed
    Event.wait), a long one ends as soon as `stop` is set."""
    stop = threading.Event()
    t0 = time.monotonic()
    wait_until(stop, 0.05)
    assert 0.045 <= time.monotonic() - t0 < 0.05 + SLEEP_MAX_S
    wait_until(stop, -1.0)  # overdue: no wait
    threading.Timer(0.1, stop.set).start()
    t0 = time.monotonic()
    wait_until(stop, 30.0)
    assert time.monotonic() - t0 < 5.0


def test_agent_with_default_cadences_stops_promptly(tmp_path: Path, collector: Collector) -> None:
    """With the default 1 s interval and 10 Hz peaks the loop sleeps rather than waits on the stop event: a stop is
    still noticed within a fast interval (plus the final batch and flush), and the 10 Hz peak ticks happen."""
    nvml = make_fake(2, compute_processes=[(os.getpid(), 1 << 30)])  # busy GPUs: ticked at 10 Hz throughout
    agent = Agent(settings(tmp_path, collector, interval_s=1.0, fast_interval_s=0.1, batch_interval_s=5.0),
                  NvmlDevices(nvml))
    stop = threading.Event()
    t = threading.Thread(target=agent.run, args=(stop,))
    t.start()
    time.sleep(1.5)
    t0 = time.monotonic()
    stop.set()
    t.join(10)
    assert not t.is_alive()
    assert time.monotonic() - t0 < 3.0
    # 10 Hz memory readings of both GPUs over 1.5 s: well over the 2 full readings' worth
    assert nvml.calls.get("nvmlDeviceGetMemoryInfo", 0) >= 2 * 10
    assert len(collector.rows()) >= 2  # the final batch, cut and shipped at the stop


def test_full_reading_stands_in_for_the_fast_tick_due_with_it(tmp_path: Path, collector: Collector,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """At 1 s / 10 Hz every 10th fast tick falls due with the full reading, which reads memory and power of every
    GPU itself: that tick is not made. On a virtual clock (each wake-up 0.5 ms late, as a real one is): one memory
    reading per GPU and 100 ms, the full readings' included, and every interval's row aggregates 10 of them."""
    import agent.daemon as daemon

    now = [1000.0]
    stop = threading.Event()

    class VirtualTime:
        time = staticmethod(time.time)

        @staticmethod
        def monotonic() -> float:
            return now[0]

        @staticmethod
        def sleep(seconds: float) -> None:
            now[0] += seconds + 0.0005
            if now[0] >= 1000.0 + 3.05:
                stop.set()

    nvml = make_fake(2, compute_processes=[(os.getpid(), 1 << 30)])
    agent = Agent(settings(tmp_path, collector, interval_s=1.0, fast_interval_s=0.1, batch_interval_s=100.0),
                  NvmlDevices(nvml))
    before = nvml.calls["nvmlDeviceGetMemoryInfo"]
    monkeypatch.setattr(daemon, "time", VirtualTime)
    agent.run(stop)
    monkeypatch.undo()
    assert agent.samples_spooled == 2 * 3  # full readings at 1, 2 and 3 s
    reads = nvml.calls["nvmlDeviceGetMemoryInfo"] - before
    # one per GPU at each grid point 0.0, 0.1, ..., 3.0 (31), the full readings' included (not 31 + 3)
    assert reads == 2 * 31, reads
