"""Issue #20's health findings on the pages that show them: the job page's "GPU health" card, the node page's "GPUs
needing attention" and the fleet page's attention rows, built as Dash layouts from the real API's answers about a
job shipped by the real agent code from the NVML test double (tests/server/faulty_gpu.py), and in a real headless
Chromium; the double's data says so.
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from dashboard import data
from dashboard.pages.fleet import attention_rows
from dashboard.pages.job import health_section
from dashboard.pages.nodes import attention_section
from fleetprof.api_models import FleetSummary
from tests.dashboard.test_gpm_pages import _find, _text
from tests.server.fake_node import poster
from tests.server.faulty_gpu import COUNTS, FAULTY, FLAGS, SOURCE, ship_faulty_job
from tests.server.helpers import auth

NODE = "health-node"


def _rows(table: Any) -> list[list[str]]:
    """The body rows of a components.table as the text of each cell."""
    body = table.children[1]
    return [[_text(td) for td in tr.children] for tr in body.children]


def test_job_node_and_fleet_pages_show_the_faulty_gpus_findings(api, make_token) -> None:  # type: ignore[no-untyped-def]
    post = poster(api)

    op, truth = ship_faulty_job(post, make_token, node=NODE, job_id="health-page-job")

    # the job page: one row per finding, all on the faulty GPU, with its count and the double's label
    report = data.job_report(api.get("/api/v1/jobs/health-page-job/report", headers=auth(op)).json())
    columns = ["GPU", "kind", "severity", "for", "share", "count", "since", "what", "source"]
    table = _find(health_section(report), "job-health")
    assert [_text(th) for th in table.children[0].children.children] == columns
    rows = [dict(zip(columns, r, strict=True)) for r in _rows(table)]
    assert {r["GPU"] for r in rows} == {truth.bad}
    counts = {k: str(n) for k, n in COUNTS.items()}
    assert {r["kind"]: r["count"] for r in rows} == {**counts, **dict.fromkeys(FLAGS, "-"),
                                                    "temperature_near_slowdown": "-"}
    assert all(r["source"].endswith(SOURCE) for r in rows)
    counted = [r for r in rows if r["kind"] in COUNTS]
    assert {(r["for"], r["share"]) for r in counted} == {("-", "-")}  # a counted event: no duration, not unknown
    assert all(r["for"] not in ("-", "unknown") for r in rows if r["kind"] in FLAGS)

    # the node page: the faulty GPU alone needs attention, each finding with the double's label
    gpus = api.get("/api/v1/gpus", params={"node": NODE}, headers=auth(op)).json()
    (row,) = _rows(_find(attention_section(gpus), "node-attention"))
    assert row[0] == str(FAULTY) and row[3] == truth.bad
    for kind in (*COUNTS, *FLAGS):
        assert kind in row[2]
    assert "4 PCIe replays" in row[2] and row[2].count(SOURCE) == len(COUNTS) + len(FLAGS)

    # the fleet page's attention list
    summary = FleetSummary.model_validate(
        api.get("/api/v1/fleet/summary", params={"window": "1h"}, headers=auth(op)).json())
    ours = [r for r in attention_rows(summary) if r[5] in (truth.bad, truth.good)]
    assert [(r[1], r[3], r[5]) for r in ours] == [(str(FAULTY), "critical", truth.bad)]
    assert "3 NVLink errors" in _text(ours[0][4])


@pytest.mark.browser
def test_browser_job_and_node_pages_show_the_findings(chrome, dashboard_url, live_server, make_token) -> None:  # type: ignore[no-untyped-def]
    from selenium.webdriver.common.by import By

    from tests.dashboard.test_browser import _console_errors, _sign_in, _wait

    post = poster(httpx, live_server)

    op, truth = ship_faulty_job(post, make_token, node=NODE, job_id="health-browser-job")
    driver = chrome
    driver.get_log("browser")
    _sign_in(driver, dashboard_url, op, "operator")
    driver.get(f"{dashboard_url}/jobs/health-browser-job")
    _wait(driver, "#job-health", "pcie_replay")
    text = driver.find_element(By.ID, "job-health").text
    assert truth.bad in text and truth.good not in text and SOURCE.strip() in text
    assert all(kind in text for kind in (*COUNTS, *FLAGS))
    driver.get(f"{dashboard_url}/nodes/{NODE}")
    _wait(driver, "#node-attention", truth.bad)
    text = driver.find_element(By.ID, "node-attention").text
    assert truth.good not in text and "4 PCIe replays" in text and SOURCE.strip() in text
    assert _console_errors(driver) == []
