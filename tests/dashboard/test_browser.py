"""Every page in a real headless Chromium against the real API on the test Postgres."""

from __future__ import annotations

import httpx
import pytest

from dashboard import format as fmt
from tests.dashboard.conftest import replay
from tests.server.helpers import auth

pytestmark = pytest.mark.browser

H100 = "nvidia-smi/linux-x86_64__nvidia-h100-80gb-hbm3__590.48.01.txt"
XSS = "<script>alert(1)</script>"
TIMEOUT_S = 20


@pytest.fixture
def seeded(live_server, make_token, cli_env, shared_data):  # type: ignore[no-untyped-def]
    operator = make_token("operator")
    replay(cli_env, live_server, operator, str(shared_data / H100), "vision-h100", "n1", "vision")
    r = httpx.post(f"{live_server}/api/v1/jobs", headers=auth(operator), timeout=30,
                   json={"job_id": "xss-job", "team": "nlp", "name": XSS, "state": "finished",
                         "started_at": 1784016758.0, "ended_at": 1784016800.0})
    r.raise_for_status()
    report = httpx.get(f"{live_server}/api/v1/jobs/vision-h100/report", headers=auth(operator), timeout=60).json()
    return {"operator": operator, "vision": make_token("team", team="vision"), "report": report}


def _wait(driver, css: str, text: str | None = None):  # type: ignore[no-untyped-def]
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    wait = WebDriverWait(driver, TIMEOUT_S)
    if text is None:
        return wait.until(ec.visibility_of_element_located((By.CSS_SELECTOR, css)))
    wait.until(ec.text_to_be_present_in_element((By.CSS_SELECTOR, css), text))
    return driver.find_element(By.CSS_SELECTOR, css)


def _sign_in(driver, url: str, token: str, expect: str) -> None:  # type: ignore[no-untyped-def]
    driver.get(f"{url}/signin")  # a fresh tab state: drop any earlier session
    driver.execute_script("window.sessionStorage.clear()")
    driver.get(f"{url}/?token={token}")
    _wait(driver, "#whoami", expect)
    assert "token=" not in driver.current_url  # the token leaves the address bar


def _console_errors(driver) -> list[str]:  # type: ignore[no-untyped-def]
    return [e["message"] for e in driver.get_log("browser") if e["level"] == "SEVERE"]


def _click_link(driver, text: str) -> None:  # type: ignore[no-untyped-def]
    from selenium.webdriver.common.by import By

    driver.find_element(By.LINK_TEXT, text).click()


def test_operator_walks_every_page(chrome, dashboard_url, seeded, live_server) -> None:  # type: ignore[no-untyped-def]
    from selenium.webdriver.common.by import By

    driver = chrome
    driver.get_log("browser")  # drop earlier entries
    _sign_in(driver, dashboard_url, seeded["operator"], "operator")

    # Fleet: KPIs (or the API's own error, reported as such) and the figures.
    _wait(driver, "#fleet-heatmap .main-svg")
    summary = httpx.get(f"{live_server}/api/v1/fleet/summary", headers=auth(seeded["operator"]), timeout=30)
    if summary.status_code == 200:
        _wait(driver, "#kpi-gpus-value", fmt.count(summary.json()["gpus_total"]))
    else:
        _wait(driver, "#fleet-error", str(summary.status_code))

    # Navigation: Jobs -> job page, by clicking.
    _click_link(driver, "Jobs")
    _wait(driver, "#jobs-list", "vision-h100")
    _click_link(driver, "vision-h100")
    mem = seeded["report"]["memory"]
    _wait(driver, "#job-peak-used-value", fmt.gib(mem["peak_used_bytes"]))
    assert driver.find_element(By.ID, "job-headroom-value").text == fmt.gib(mem["headroom_bytes"])
    assert driver.find_element(By.ID, "job-peak-allocated-value").text == "unknown"  # no hooks: unknown, not 0
    _wait(driver, "#job-energy-source", "integrated power")
    _wait(driver, "#job-energy", fmt.energy(seeded["report"]["energy"]["energy_j"]))
    _wait(driver, "#job-memory .main-svg")
    from selenium.webdriver.support.ui import WebDriverWait

    # every timeline holds the job's samples (a first draw must not be swallowed by the plot's own autosize)
    for graph in ("job-memory", "job-power", "job-util"):
        WebDriverWait(driver, 30).until(lambda d, g=graph: d.execute_script(
            "const p = document.querySelector('#' + arguments[0] + ' .js-plotly-plot');"
            "const d = p && p._fullData;"  # decoded traces (typed arrays arrive base64-encoded in p.data)
            "return !!(d && d.length > 0 && d[0].x && d[0].x.length >= 2);", g))
    _wait(driver, "#job-recommendations", seeded["report"]["recommendations"][0]["summary"])

    _click_link(driver, "Nodes")
    _wait(driver, "#nodes-list", "n1")
    _click_link(driver, "n1")
    _wait(driver, "#node-gpus", "NVIDIA H100 80GB HBM3")

    _click_link(driver, "Estimator")
    _wait(driver, "#est-submit").click()
    _wait(driver, "#est-result div")  # an answer, or the clear "not available" notice
    assert _console_errors(driver) == []


def test_team_token_cannot_open_another_teams_job(chrome, dashboard_url, seeded) -> None:  # type: ignore[no-untyped-def]
    from selenium.webdriver.common.by import By

    driver = chrome
    driver.get_log("browser")
    _sign_in(driver, dashboard_url, seeded["vision"], "team")
    driver.get(f"{dashboard_url}/jobs/xss-job")
    _wait(driver, "#job-error", "404")
    assert not driver.find_elements(By.ID, "job-peak-used")
    driver.get(f"{dashboard_url}/jobs")
    _wait(driver, "#jobs-list", "vision-h100")
    assert "xss-job" not in driver.find_element(By.ID, "jobs-list").text
    assert not driver.find_elements(By.LINK_TEXT, "Fleet")  # operator pages are not offered
    driver.get(f"{dashboard_url}/")
    _wait(driver, "#fleet-need-operator")
    assert _console_errors(driver) == []


def test_user_strings_render_as_text(chrome, dashboard_url, seeded) -> None:  # type: ignore[no-untyped-def]
    from selenium.common.exceptions import NoAlertPresentException
    from selenium.webdriver.common.by import By

    driver = chrome
    driver.get_log("browser")
    _sign_in(driver, dashboard_url, seeded["operator"], "operator")
    driver.get(f"{dashboard_url}/jobs/xss-job")
    _wait(driver, "#job-meta", XSS)
    _wait(driver, "#job-title", XSS)
    driver.get(f"{dashboard_url}/jobs")
    _wait(driver, "#jobs-list", XSS)
    with pytest.raises(NoAlertPresentException):
        driver.switch_to.alert.text  # noqa: B018 - the script never ran
    assert not driver.find_elements(By.CSS_SELECTOR, "#jobs-list script")
    assert _console_errors(driver) == []


def test_sign_in_form(chrome, dashboard_url, seeded) -> None:  # type: ignore[no-untyped-def]
    from selenium.webdriver.common.by import By

    driver = chrome
    driver.get(f"{dashboard_url}/signin")
    driver.execute_script("window.sessionStorage.clear()")
    driver.get(f"{dashboard_url}/signin")
    box = _wait(driver, "#signin-token")
    box.send_keys("fp_not_a_token")
    driver.find_element(By.ID, "signin-submit").click()
    _wait(driver, "#signin-message", "refused")
    from selenium.webdriver.common.keys import Keys

    box.send_keys(Keys.CONTROL, "a")  # clear() does not reach React's state
    box.send_keys(Keys.DELETE)
    box.send_keys(seeded["vision"])
    driver.find_element(By.ID, "signin-submit").click()
    _wait(driver, "#whoami", "team")
    _wait(driver, "#jobs-list", "vision-h100")  # a team lands on its jobs
