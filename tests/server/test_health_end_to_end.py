"""Issue #20's joins, end to end: the NVML test double, scripted so one GPU's health counters rise mid-job, -> the
agent's real NVML code and sampler (health counters every HEALTH_EVERY readings, staggered by GPU, as in
production) -> the collector's ingest -> Postgres -> the loader -> characterize -> the report's `health.findings`,
`GET /api/v1/gpus?node=N` and the fleet summary's `gpus_needing_attention`.

The truth is the script below (what the double was told, and when the agent could first read it), not read back
from fleetprof's analyzers."""

from __future__ import annotations

import time
from typing import Any

import pynvml
import pytest

from agent.devices.fake import FakeNvml
from tests.agent.conftest import make_fake
from tests.server.fake_node import ship_job
from tests.server.helpers import auth

NODE = "node-health"
READINGS = 150  # 1 s apart
HEALTH_EVERY = 30  # the agent's default cadence of the health counters
FAULTY, CLEAN = 1, 0  # GPU indexes (slot 1: its health readings fall at k % 30 == 1, not at the batch's start)
RISE_AT = 70  # reading before which the faulty GPU's counters rise
HOT_AT = 40  # reading from which the faulty GPU runs within 3 °C of its slowdown threshold
SLOWDOWN_C = 80  # the faulty GPU's NVML slowdown threshold (the double's fact; an H100's catalogue value is higher)
REPLAY, FLIT = pynvml.NVML_NVLINK_ERROR_DL_REPLAY, pynvml.NVML_NVLINK_ERROR_DL_CRC_FLIT
# counter kinds -> how much they rose while the job ran (the baselines before the job are not counted)
COUNTS = {"retired_pages": 1, "ecc_uncorrected": 1, "pcie_replay": 4, "nvlink_errors": 3}
FLAGS = {"retired_pages_pending", "row_remap_pending"}
SOURCE = " (NVML test double)"


def _fake() -> FakeNvml:
    fake = make_fake(2)
    bad, good = fake.gpus[FAULTY], fake.gpus[CLEAN]
    bad.slowdown_temperature_c, bad.max_sm_clock_mhz = SLOWDOWN_C, 1980
    bad.pcie_replay, bad.nvlink_errors = 5, {(0, REPLAY): 2}  # errors from before the job: not its findings
    # the clean GPU runs as hot, under its own (default) threshold, and carries old counts that do not rise
    good.temperature_c = SLOWDOWN_C - 3
    good.pcie_replay, good.ecc_corrected_volatile, good.retired_pages_sbe = 12, 3, 2
    return fake


def _script(k: int, fake: FakeNvml) -> None:
    bad = fake.gpus[FAULTY]
    if k == HOT_AT:
        bad.temperature_c = SLOWDOWN_C - 3
    if k == RISE_AT:
        bad.retired_pages_dbe, bad.retired_pages_pending = 1, True  # a double-bit error retires a page at reset
        bad.remapped_rows_pending = True
        bad.ecc_uncorrected_volatile += 1
        bad.pcie_replay += 4
        bad.nvlink_errors = {(0, REPLAY): 4, (1, FLIT): 1}


def _first_health_reading_from(k: int, slot: int) -> int:
    """The first reading at or after `k` at which the agent reads `slot`'s health counters."""
    return next(n for n in range(k, READINGS) if n % HEALTH_EVERY == slot % HEALTH_EVERY)


@pytest.fixture
def shipped(api, make_token) -> dict[str, Any]:  # type: ignore[no-untyped-def]
    op, agent = make_token("operator"), make_token("agent", node=NODE)

    def post(path: str, body: Any, token: str) -> tuple[int, Any]:
        r = api.post(path, content=body, headers={**auth(token), "Content-Type": "application/json"}) \
            if isinstance(body, str) else api.post(path, json=body, headers=auth(token))
        return r.status_code, r.json()

    fake = _fake()
    t0 = float(int(time.time()) - READINGS - 60)
    ship_job(post, fake=fake, node=NODE, agent=agent, op=op, job_id="health-e2e", t0=t0, readings=READINGS,
             script=_script, health_every=HEALTH_EVERY)
    return {"op": op, "t0": t0, "bad": fake.gpus[FAULTY].uuid, "good": fake.gpus[CLEAN].uuid}


def test_report_names_the_faulty_gpu_its_kinds_counts_and_since_times(api, shipped) -> None:  # type: ignore[no-untyped-def]
    t0, bad = shipped["t0"], shipped["bad"]
    report = api.get("/api/v1/jobs/health-e2e/report", headers=auth(shipped["op"])).json()
    health = report["health"]
    assert health["gpus_checked"] == 2 and health["gpus_with_findings"] == 1
    assert {f["gpu_uuid"] for f in health["findings"]} == {bad}  # the clean GPU gets none
    by_kind = {f["kind"]: f for f in health["findings"]}
    assert set(by_kind) == set(COUNTS) | FLAGS | {"temperature_near_slowdown"}
    seen = t0 + _first_health_reading_from(RISE_AT, FAULTY)  # when the agent could first read the rise
    for kind, count in COUNTS.items():
        f = by_kind[kind]
        assert (f["count"], f["since_ts"], f["seconds"]) == (count, seen, None), f
    assert "double-bit" in by_kind["retired_pages"]["summary"]
    assert by_kind["ecc_uncorrected"]["severity"] == "critical"
    assert by_kind["ecc_uncorrected"]["source"] == "nvml:ecc volatile (ecc_uncorrected_volatile)" + SOURCE
    # a flag read every 30 s holds between its readings: raised from the reading that saw it to the job's end
    for kind in FLAGS:
        f = by_kind[kind]
        assert f["since_ts"] == seen and f["until_ts"] == t0 + READINGS - 1, f
        assert f["seconds"] == pytest.approx(READINGS - (seen - t0), abs=1.0), f
        assert f["fraction"] == pytest.approx(f["seconds"] / READINGS, abs=0.01)
    hot = by_kind["temperature_near_slowdown"]
    assert hot["since_ts"] == t0 + HOT_AT and hot["seconds"] == pytest.approx(READINGS - HOT_AT, abs=1.0)
    assert hot["slowdown_temperature_c"] == SLOWDOWN_C and hot["temperature_max_c"] == SLOWDOWN_C - 3
    assert hot["slowdown_temperature_source"] == "nvml:temperature threshold SLOWDOWN" + SOURCE
    assert all(f["source"].endswith(SOURCE) for f in health["findings"])


def test_node_gpus_and_fleet_summary_list_the_faulty_gpu(api, shipped) -> None:  # type: ignore[no-untyped-def]
    op, bad, good = shipped["op"], shipped["bad"], shipped["good"]
    gpus = {g["uuid"]: g for g in api.get("/api/v1/gpus", params={"node": NODE}, headers=auth(op)).json()}
    assert gpus[good]["findings"] == []
    assert gpus[bad]["slowdown_temperature_c"] == SLOWDOWN_C
    found = {f["kind"]: f for f in gpus[bad]["findings"]}
    # the recent window reads each GPU's first and last health reading: counters as last - first, flags as last
    assert set(found) == set(COUNTS) | FLAGS
    assert {k: found[k]["count"] for k in COUNTS} == COUNTS
    assert all(f["source"].endswith(SOURCE) for f in found.values())

    summary = api.get("/api/v1/fleet/summary", params={"window": "1h"}, headers=auth(op)).json()
    attention = [a for a in summary["gpus_needing_attention"] if a["node"] == NODE]
    assert [(a["gpu_uuid"], a["gpu_index"], a["severity"]) for a in attention] == [(bad, FAULTY, "critical")]
    assert {f["kind"]: f.get("count") for f in attention[0]["findings"]} == {**COUNTS, **dict.fromkeys(FLAGS)}
