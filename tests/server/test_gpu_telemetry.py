"""Issue #20's new fields end to end: the NVML test double -> NvmlDevices -> Sampler -> the wire (the collector's
fast path) -> Postgres -> the loader's JobData -> the report's utilization.gpm, and the node routes."""

from __future__ import annotations

import time

import numpy as np
import pynvml
import pytest
from sqlalchemy import select

from tests.agent.conftest import make_fake
from tests.server.fake_node import poster, ship_job
from tests.server.helpers import auth

NODE = "node-t"


def _ship(api, agent: str, fake, *, t0: float, readings: int, job_id: str, op: str) -> None:  # type: ignore[no-untyped-def]
    post = poster(api)

    ship_job(post, fake=fake, node=NODE, agent=agent, op=op, job_id=job_id, t0=t0, readings=readings)


@pytest.fixture
def tokens(make_token):  # type: ignore[no-untyped-def]
    return make_token("operator"), make_token("agent", node=NODE)


def test_gpm_and_health_fields_reach_the_database_loader_and_report(api, tokens, db_session, server_settings):  # type: ignore[no-untyped-def]
    op, agent = tokens
    fake = make_fake(2, max_sm_clock_mhz=1980, slowdown_temperature_c=87)
    fake.gpus[0].gpm_supported = True  # GPU 1 has no GPM
    g0 = fake.gpus[0]
    g0.ecc_corrected_volatile, g0.remapped_rows_correctable, g0.pcie_replay = 2, 3, 5
    g0.nvlink_links = 2
    g0.nvlink_errors = {(1, pynvml.NVML_NVLINK_ERROR_DL_REPLAY): 6}
    t0 = time.time() - 600
    _ship(api, agent, fake, t0=t0, readings=6, job_id="gpm-job", op=op)

    # loader: the analyzers' arrays, None-filled (NaN) where unsupported or not sampled
    from server.jobs.loader import load_job_data
    from server.models import Job

    job = db_session.scalar(select(Job).where(Job.job_id == "gpm-job"))
    data = load_job_data(db_session, job, server_settings, now=time.time())
    s0, s1 = data.gpus
    assert (s0.max_sm_clock_mhz, s0.slowdown_temperature_c, s0.sample_source) == (1980.0, 87.0, "test")
    sm0 = s0.column("gpm_sm_activity_pct")
    assert np.isnan(sm0[0]) and list(sm0[1:]) == [20.0 + 10.0 * k for k in range(1, 6)]
    assert np.all(np.isnan(s1.column("gpm_sm_activity_pct")))
    assert s0.column("pcie_replay_total")[0] == 5 and np.isnan(s0.column("pcie_replay_total")[2])
    assert s0.column("nvlink_errors_total")[0] == 6 and s0.column("remapped_rows_correctable")[0] == 3
    assert s0.column("ecc_corrected_volatile")[0] == 2
    assert s0.column("retired_pages_sbe")[0] == 0  # the double retires pages unless told it cannot

    report = api.get("/api/v1/jobs/gpm-job/report", headers=auth(op)).json()
    g = report["utilization"]["gpm"]
    assert g["gpus_with_gpm"] == 1 and g["source"] == "NVML GPM (NVML test double)"
    assert g["sm_activity_mean_pct"] == pytest.approx(np.mean([20.0 + 10.0 * k for k in range(1, 6)]))
    assert g["tensor_activity_mean_pct"] == pytest.approx(g["sm_activity_mean_pct"] / 2)
    assert g["dram_bw_util_mean_pct"] == pytest.approx(24.03)
    by_gpu = {x["gpu_uuid"]: x for x in g["gpus"]}
    assert by_gpu[fake.gpus[0].uuid]["samples"] == 5
    assert by_gpu[fake.gpus[1].uuid] == {**by_gpu[fake.gpus[1].uuid], "samples": 0, "sm_activity_mean_pct": None,
                                         "source": None}
    assert report["sources"]["utilization.gpm"] == "NVML GPM (NVML test double)"

    gpus = api.get("/api/v1/gpus", params={"node": NODE}, headers=auth(op)).json()
    assert [(x["max_sm_clock_mhz"], x["slowdown_temperature_c"]) for x in gpus] == [(1980.0, 87.0)] * 2

    recent = api.get("/api/v1/gpus/gpm", params={"node": NODE, "window_s": 3600}, headers=auth(op)).json()
    assert [x["samples"] for x in recent] == [5, 0]
    assert recent[0]["sm_activity_mean_pct"] == pytest.approx(g["sm_activity_mean_pct"])
    assert recent[0]["source"] == "NVML GPM (NVML test double)" and recent[1]["source"] is None
    assert recent[1]["tensor_activity_mean_pct"] is None
    # the window is the recent past: 6 samples ten minutes old are outside the last 60 s
    assert api.get("/api/v1/gpus/gpm", params={"node": NODE, "window_s": 60},
                   headers=auth(op)).json()[0]["samples"] == 0


def test_a_job_without_gpm_reports_unknown(api, tokens):  # type: ignore[no-untyped-def]
    op, agent = tokens
    fake = make_fake(1)  # the double's default: no GPM
    _ship(api, agent, fake, t0=time.time() - 300, readings=4, job_id="no-gpm", op=op)
    g = api.get("/api/v1/jobs/no-gpm/report", headers=auth(op)).json()["utilization"]["gpm"]
    assert g["gpus_with_gpm"] == 0 and g["source"] is None and g["sm_activity_mean_pct"] is None
    assert g["gpus"][0]["samples"] == 0


def test_gpm_route_refuses_bad_input_and_other_scopes(api, tokens, make_token):  # type: ignore[no-untyped-def]
    op, agent = tokens
    assert api.get("/api/v1/gpus/gpm", params={"node": NODE, "window_s": 1}, headers=auth(op)).status_code == 422
    assert api.get("/api/v1/gpus/gpm", params={"node": NODE, "window_s": "x"}, headers=auth(op)).status_code == 422
    assert api.get("/api/v1/gpus/gpm", headers=auth(op)).status_code == 422  # node is required
    assert api.get("/api/v1/gpus/gpm", params={"node": "nowhere"}, headers=auth(op)).status_code == 404
    team = make_token("team", team="vision")
    assert api.get("/api/v1/gpus/gpm", params={"node": NODE}, headers=auth(team)).status_code == 403
    assert api.get("/api/v1/gpus/gpm", params={"node": NODE}, headers=auth(agent)).status_code == 403


def test_ingest_refuses_out_of_range_new_columns(api, tokens):  # type: ignore[no-untyped-def]
    from tests.server.helpers import sample_batch

    op, agent = tokens
    batch = sample_batch(node=NODE, n=2, gpus=1)
    batch["samples"]["gpm_sm_activity_pct"] = [50.0, 101.0]
    r = api.post("/api/v1/ingest/samples", json=batch, headers=auth(agent))
    assert r.status_code == 422, r.text
    batch["samples"]["gpm_sm_activity_pct"] = [50.0, 60.0]
    batch["samples"]["remapped_rows_pending"] = [0, 2]
    assert api.post("/api/v1/ingest/samples", json=batch, headers=auth(agent)).status_code == 422
