"""`--source replay-original:FILE`: the recording's own timestamps and values, one sample per recorded row, once."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from agent.daemon import open_devices, run_agent
from agent.devices.replay import OriginalReplayDevices, ReplayDevices
from fleetprof.protocol import PROTOCOL_VERSION, GpuInfo, ProcessColumns, SampleBatch, SampleColumns
from fleetprof.recordings import dump_batch_line, read_recording
from tests.agent.collector import Collector
from tests.agent.test_daemon import settings

UUIDS = ["GPU-aaaaaaaa-0000-0000-0000-000000000000", "GPU-bbbbbbbb-0000-0000-0000-000000000000"]
T0 = 1_780_000_000.25


def _recording(path: Path, steps: int = 12, per_line: int = 5) -> Path:
    """A recording as an agent writes it: per-interval mean and max differ, processes attributed by env."""
    gpus = [GpuInfo(uuid=u, index=i, name="NVIDIA H100 80GB HBM3", memory_total_bytes=80 << 30,
                    power_source="nvmlDeviceGetPowerUsage") for i, u in enumerate(UUIDS)]
    lines = []
    for seq, k in enumerate(range(0, steps, per_line), start=1):
        idx = range(k, min(steps, k + per_line))
        ts = [T0 + 0.7 * i for i in idx for _ in UUIDS]
        uu = [u for _ in idx for u in UUIDS]
        mem = [(i + 1 + g) << 30 for i in idx for g in range(2)]
        cols = SampleColumns(ts=ts, gpu_uuid=uu, memory_used_bytes=mem,
                             healthy=[not (i == 3 and g == 1) for i in idx for g in range(2)],  # GPU 1 lost once
                             memory_used_max_bytes=[m + (1 << 28) for m in mem],
                             power_w=[100.0 + 10 * i + g for i in idx for g in range(2)],
                             power_max_w=[150.0 + 10 * i for i in idx for _ in range(2)],
                             energy_counter_j=[1000.0 + 70 * i for i in idx for _ in range(2)])
        procs = ProcessColumns(ts=[T0 + 0.7 * i for i in idx], gpu_uuid=[UUIDS[0]] * len(idx), pid=[4242] * len(idx),
                               used_memory_bytes=[1 << 30] * len(idx), job_id=["job-7"] * len(idx),
                               attribution=["env:FLEETPROF_JOB_ID"] * len(idx))
        lines.append(dump_batch_line(SampleBatch(protocol_version=PROTOCOL_VERSION, node="gpu-node-1",
                                                 agent_id="gpu-node-1-abcd", seq=seq, sent_at=ts[-1], gpus=gpus,
                                                 samples=cols, processes=procs)))
    path.write_text("\n".join(lines) + "\n")
    return path


def test_open_devices_modes(tmp_path: Path) -> None:
    rec = _recording(tmp_path / "rec.jsonl")
    assert type(open_devices(f"replay:{rec}")) is ReplayDevices
    original = open_devices(f"replay-original:{rec}")
    assert isinstance(original, OriginalReplayDevices) and original.steps_total == 12


def test_ships_every_recorded_row_verbatim_once(tmp_path: Path, collector: Collector) -> None:
    path = _recording(tmp_path / "rec.jsonl")
    rec = read_recording(path)
    stop = threading.Event()
    t = threading.Thread(target=run_agent, args=(settings(tmp_path, collector, interval_s=0.02),),
                         kwargs={"source": f"replay-original:{path}", "stop": stop})
    t.start()
    try:
        assert collector.wait_for(lambda: len(collector.rows()) >= len(rec.rows))
        # no loop: what follows the end of the recording is silence
        assert not collector.wait_for(lambda: len(collector.rows()) > len(rec.rows), timeout_s=0.5)
    finally:
        stop.set()
        t.join(10)
    batches = sorted(collector.batches.values(), key=lambda b: b.seq)
    assert all(b.source == "replay" and b.node == "node-a" for b in batches)
    got = [(u, ts, mem, mx, p, pmx, e) for b in batches
           for u, ts, mem, mx, p, pmx, e in zip(b.samples.gpu_uuid, b.samples.ts, b.samples.memory_used_bytes,
                                                b.samples.memory_used_max_bytes, b.samples.power_w,
                                                b.samples.power_max_w, b.samples.energy_counter_j)]
    want = [(r.gpu_uuid, r.ts, r.values["memory_used_bytes"], r.values["memory_used_max_bytes"], r.values["power_w"],
             r.values["power_max_w"], r.values["energy_counter_j"]) for r in rec.rows]
    assert got == want  # the recording's timestamps, its mean and its max: nothing re-aggregated
    healthy = [h for b in batches for h in b.samples.healthy or []]
    assert healthy == [r.values["healthy"] for r in rec.rows] and healthy.count(False) == 1
    procs = [(ts, pid, job, how) for b in batches if b.processes
             for ts, pid, job, how in zip(b.processes.ts, b.processes.pid, b.processes.job_id,
                                          b.processes.attribution or [])]
    assert procs == [(T0 + 0.7 * i, 4242, "job-7", "env:FLEETPROF_JOB_ID") for i in range(12)]
    assert batches[0].gpus[0].power_source == "nvmlDeviceGetPowerUsage"


def test_process_rows_between_timesteps_are_shipped_once(tmp_path: Path) -> None:
    rec = read_recording(_recording(tmp_path / "rec.jsonl", steps=3))
    from fleetprof.recordings import ProcessRow

    rec.processes += [ProcessRow(T0 - 5, UUIDS[1], 1, None), ProcessRow(T0 + 0.3, UUIDS[1], 2, None),
                      ProcessRow(T0 + 99, UUIDS[1], 3, None)]
    devices = OriginalReplayDevices(rec)
    steps = []
    while (step := devices.next_timestep()) is not None:
        steps.append(step)
    assert [len(rows) for rows, _ in steps] == [2, 2, 2]
    assert [[p.pid for p in procs] for _, procs in steps] == [[1, 4242], [2, 4242], [4242, 3]]
    assert devices.finished and devices.next_timestep() is None


@pytest.mark.parametrize("bad", ["replay-original:", "replay-original:/nonexistent.jsonl"])
def test_bad_original_sources_are_refused(bad: str) -> None:
    from agent.daemon import SourceError

    with pytest.raises(SourceError):
        open_devices(bad)
