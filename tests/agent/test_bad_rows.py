"""One bad row never stops the agent: a process row whose job id is not one is dropped, counted in
`dropped_rows_total` (shipped with every later batch), logged once, and the agent keeps shipping the rest."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from agent.attribution import K8S_POD_RESOURCES, Attribution, Attributor
from agent.daemon import Agent
from agent.devices.fake import FakeGpu, FakeNvml
from agent.devices.nvml import NvmlDevices
from tests.agent.collector import Collector
from tests.agent.test_daemon import run_for, settings

GOOD, BAD = 40, 41
JOBS = {GOOD: "k8s:ml/trainer-0", BAD: "k8s:ml/../etc"}  # what a buggy attribution might make


class FixedAttributor(Attributor):
    def attribute(self, pid: int, gpu_uuid: str | None = None) -> Attribution:
        return Attribution(JOBS.get(pid), K8S_POD_RESOURCES)


def test_a_row_with_an_invalid_job_id_is_dropped_counted_and_the_rest_shipped(
        tmp_path: Path, collector: Collector, caplog: pytest.LogCaptureFixture) -> None:
    gpus = [FakeGpu(uuid=f"GPU-{i}0000000-aaaa-bbbb-cccc-000000000000", compute_processes=[(pid, 2 << 30)])
            for i, pid in enumerate((GOOD, BAD))]
    agent = Agent(settings(tmp_path, collector), NvmlDevices(FakeNvml(gpus)), attributor=FixedAttributor(tmp_path))
    with caplog.at_level(logging.WARNING, logger="agent.sampler"):
        run_for(agent, 1.0)
    batches = sorted(collector.batches.values(), key=lambda b: b.seq)
    assert len(batches) >= 3 and batches[-1].seq == agent.sampler.seq  # it went on cutting and shipping
    procs = [(pid, job) for b in batches if b.processes
             for pid, job in zip(b.processes.pid, b.processes.job_id, strict=True)]
    samples = sum(len(b.samples) for b in batches)
    assert procs and set(procs) == {(GOOD, JOBS[GOOD])}  # every good row, no bad one
    dropped = agent.sampler.dropped_rows_total
    assert dropped == len(procs) == samples // 2  # one process row per GPU per sample: half of them were bad
    assert batches[-1].dropped_rows_total == dropped and batches[0].dropped_rows_total
    warnings = [r.getMessage() for r in caplog.records if "dropped_rows_total" in r.getMessage()]
    assert len(warnings) == 1 and "process.job_id" in warnings[0] and JOBS[BAD] in warnings[0]
    assert len(agent.spool) == 0

