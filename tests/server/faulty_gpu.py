"""A job on two GPUs of the NVML test double, scripted so that one GPU's health counters rise mid-job, sampled by the
agent's real NVML code and sampler (health counters every HEALTH_EVERY readings, staggered by GPU, as in production)
and shipped as the agent's wire JSON: the truth of issue #20's health end-to-end, dashboard and CLI tests.

The truth is this script (what the double was told, and when the agent could first read it), never read back from
fleetprof's analyzers."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import pynvml

from agent.devices.fake import FakeNvml
from tests.agent.conftest import make_fake
from tests.server.fake_node import Post, ship_job

READINGS = 150  # 1 s apart
HEALTH_EVERY = 30  # the agent's default cadence of the health counters
FAULTY, CLEAN = 1, 0  # GPU indexes (slot 1: its health readings fall at k % 30 == 1, not at the batch's start)
RISE_AT = 70  # reading before which the faulty GPU's counters rise
HOT_AT = 40  # reading from which the faulty GPU runs within 3 °C of its slowdown threshold
SLOWDOWN_C = 80  # the faulty GPU's NVML slowdown threshold (the double's fact; an H100's catalogue value is higher)
REPLAY, FLIT = pynvml.NVML_NVLINK_ERROR_DL_REPLAY, pynvml.NVML_NVLINK_ERROR_DL_CRC_FLIT
# counter finding kinds -> how much they rose while the job ran (the baselines before the job are not counted)
COUNTS = {"retired_pages": 1, "ecc_uncorrected": 1, "pcie_replay": 4, "nvlink_errors": 3}
FLAGS = {"retired_pages_pending", "row_remap_pending"}
SOURCE = " (NVML test double)"  # how every finding's source labels the double's data


def make_faulty_fake() -> FakeNvml:
    fake = make_fake(2)
    bad, good = fake.gpus[FAULTY], fake.gpus[CLEAN]
    bad.slowdown_temperature_c, bad.max_sm_clock_mhz = SLOWDOWN_C, 1980
    bad.pcie_replay, bad.nvlink_errors = 5, {(0, REPLAY): 2}  # errors from before the job: not its findings
    # the clean GPU runs as hot, under its own (default) threshold, and carries old counts that do not rise
    good.temperature_c = SLOWDOWN_C - 3
    good.pcie_replay, good.ecc_corrected_volatile, good.retired_pages_sbe = 12, 3, 2
    return fake


def script(k: int, fake: FakeNvml) -> None:
    bad = fake.gpus[FAULTY]
    if k == HOT_AT:
        bad.temperature_c = SLOWDOWN_C - 3
    if k == RISE_AT:
        bad.retired_pages_dbe, bad.retired_pages_pending = 1, True  # a double-bit error retires a page at reset
        bad.remapped_rows_pending = True
        bad.ecc_uncorrected_volatile += 1
        bad.pcie_replay += 4
        bad.nvlink_errors = {(0, REPLAY): 4, (1, FLIT): 1}


def first_health_reading_from(k: int, slot: int) -> int:
    """The first reading at or after `k` at which the agent reads `slot`'s health counters."""
    return next(n for n in range(k, READINGS) if n % HEALTH_EVERY == slot % HEALTH_EVERY)


@dataclass(frozen=True)
class Shipped:
    t0: float
    bad: str  # the faulty GPU's uuid
    good: str

    @property
    def seen_ts(self) -> float:
        """When the agent could first read the faulty GPU's rise."""
        return self.t0 + first_health_reading_from(RISE_AT, FAULTY)


def ship_faulty_job(post: Post, make_token: Callable[..., str], *, node: str, job_id: str) -> tuple[str, Shipped]:
    """Ship the job (ended a minute ago, inside the node's one-hour attention window); (operator token, truth)."""
    op, agent = make_token("operator"), make_token("agent", node=node)
    fake = make_faulty_fake()
    t0 = float(int(time.time()) - READINGS - 60)
    ship_job(post, fake=fake, node=node, agent=agent, op=op, job_id=job_id, t0=t0, readings=READINGS,
             script=script, health_every=HEALTH_EVERY)
    return op, Shipped(t0=t0, bad=fake.gpus[FAULTY].uuid, good=fake.gpus[CLEAN].uuid)
