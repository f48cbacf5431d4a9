"""Issue #20's acceptance: with the NVML test double exposing GPM, the job page shows SM activity and tensor
activity; without GPM, "unknown". The pages are built from the real API's answers (data shipped by the real agent
code from the double), as Dash layouts and in a real headless Chromium; the double's data says so."""

from __future__ import annotations

import time
from typing import Any

import httpx
import numpy as np
import pytest

from dashboard import data
from dashboard import format as fmt
from dashboard.pages.job import gpm_section, kpis
from dashboard.pages.nodes import gpm_section as node_gpm_section
from tests.agent.conftest import make_fake
from tests.server.fake_node import poster, ship_job, sm_ramp
from tests.server.helpers import auth

NODE = "gpm-node"
READINGS = 6
SOURCE = "NVML GPM (NVML test double)"
# the first reading has no GPM interval yet: the mean is over readings 1..5
SM_MEAN = float(np.mean([sm_ramp(k) for k in range(1, READINGS)]))


def _find(component: Any, id_: str) -> Any:
    if getattr(component, "id", None) == id_:
        return component
    children = getattr(component, "children", None)
    for child in children if isinstance(children, list | tuple) else [children]:
        if child is not None and not isinstance(child, str | int | float):
            found = _find(child, id_)
            if found is not None:
                return found
    return None


def _text(component: Any) -> str:
    if component is None:
        return ""
    if isinstance(component, str | int | float):
        return str(component)
    children = getattr(component, "children", None)
    if isinstance(children, list | tuple):
        return " ".join(_text(c) for c in children)
    return _text(children)


def _seed(post, make_token) -> dict[str, str]:  # type: ignore[no-untyped-def]
    op, agent = make_token("operator"), make_token("agent", node=NODE)
    gpm = make_fake(2, max_sm_clock_mhz=1980)
    gpm.gpus[0].gpm_supported = gpm.gpus[1].gpm_supported = True
    t0 = time.time() - 200  # inside the node page's 5-minute window
    ship_job(post, fake=gpm, node=NODE, agent=agent, op=op, job_id="gpm-job", t0=t0, readings=READINGS)
    older = make_fake(1)  # GPM off: the double's default, as every GPU before Hopper
    older.gpus[0].uuid = "GPU-older-0000"
    ship_job(post, fake=older, node=NODE, agent=agent, op=op, job_id="no-gpm-job", t0=t0 + 30, readings=READINGS)
    return {"operator": op}


def test_job_and_node_layouts_show_gpm_and_unknown_through_the_real_api(api, make_token) -> None:  # type: ignore[no-untyped-def]
    post = poster(api)

    op = _seed(post, make_token)["operator"]
    report = data.job_report(api.get("/api/v1/jobs/gpm-job/report", headers=auth(op)).json())
    head = kpis(report)
    assert _text(_find(head, "job-gpm-sm-value")) == fmt.pct(SM_MEAN)
    assert _text(_find(head, "job-gpm-tensor-value")) == fmt.pct(SM_MEAN / 2)
    assert f"source: {SOURCE}" in _text(_find(head, "job-gpm-sm"))  # the double's data is labelled as such
    card = gpm_section(report)
    table = _find(card, "job-gpm")
    assert _text(table).count(fmt.pct(SM_MEAN)) == 2 and SOURCE in _text(_find(card, "job-gpm-source"))

    without = data.job_report(api.get("/api/v1/jobs/no-gpm-job/report", headers=auth(op)).json())
    head = kpis(without)
    assert _text(_find(head, "job-gpm-sm-value")) == "unknown"
    assert _text(_find(head, "job-gpm-tensor-value")) == "unknown"
    assert "source: unknown" in _text(_find(head, "job-gpm-sm"))
    assert "unknown" in _text(_find(gpm_section(without), "job-gpm-source"))

    node = api.get("/api/v1/gpus/gpm", params={"node": NODE}, headers=auth(op)).json()
    rows = _text(_find(node_gpm_section(node), "node-gpm"))
    assert rows.count(fmt.pct(SM_MEAN)) == 2 and SOURCE in rows and "unknown (no GPM samples)" in rows


@pytest.mark.browser
def test_browser_job_page_gpm_and_unknown(chrome, dashboard_url, live_server, make_token) -> None:  # type: ignore[no-untyped-def]
    from selenium.webdriver.common.by import By

    from tests.dashboard.test_browser import _console_errors, _plot, _sign_in, _wait

    post = poster(httpx, live_server)

    op = _seed(post, make_token)["operator"]
    driver = chrome
    driver.get_log("browser")
    _sign_in(driver, dashboard_url, op, "operator")
    driver.get(f"{dashboard_url}/jobs/gpm-job")
    _wait(driver, "#job-gpm-sm-value", fmt.pct(SM_MEAN))
    assert driver.find_element(By.ID, "job-gpm-tensor-value").text == fmt.pct(SM_MEAN / 2)
    assert SOURCE in driver.find_element(By.ID, "job-gpm-sm").text
    _wait(driver, "#job-gpm", fmt.pct(SM_MEAN))
    util = _plot(driver, "job-util")  # NVML utilization per GPU, and GPM's SM activity dotted beside it
    assert sorted(t["name"] for t in util["traces"] if "SM activity" in t["name"]) == [
        "GPU 0 SM activity (NVML GPM)", "GPU 1 SM activity (NVML GPM)"]
    assert util["title"].endswith("dotted: SM activity (NVML GPM)")
    driver.get(f"{dashboard_url}/jobs/no-gpm-job")
    _wait(driver, "#job-title", "no-gpm-job")
    util = _plot(driver, "job-util")
    assert util["traces"] and not [t for t in util["traces"] if "SM activity" in t["name"]]
    assert "dotted" not in util["title"]
    _wait(driver, "#job-gpm-source", "unknown")
    assert driver.find_element(By.ID, "job-gpm-sm-value").text == "unknown"
    assert driver.find_element(By.ID, "job-gpm-tensor-value").text == "unknown"
    driver.get(f"{dashboard_url}/nodes/{NODE}")
    _wait(driver, "#node-gpm", fmt.pct(SM_MEAN))
    assert "unknown (no GPM samples)" in driver.find_element(By.ID, "node-gpm").text
    assert _console_errors(driver) == []
