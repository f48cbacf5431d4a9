"""Every page in a real headless Chromium against the real API on the test Postgres."""

from __future__ import annotations

import time
from datetime import UTC

import httpx
import pytest

from dashboard import format as fmt
from tests.dashboard.conftest import PAGE_PROBE_JS, replay
from tests.server.helpers import auth, gz, sample_batch

pytestmark = pytest.mark.browser

H100 = "nvidia-smi/linux-x86_64__nvidia-h100-80gb-hbm3__590.48.01.txt"
ALLOCATION_TRACE = "kineto/hta/df_index_resolver/df_index_resolver.json.gz"  # a Kineto trace with [memory] events
XSS = "<script>alert(1)</script>"
TIMEOUT_S = 40.0  # a real browser on a loaded 2-core machine: seconds per wait, not a speed target


@pytest.fixture
def seeded(live_server, make_token, cli_env, real_data):  # type: ignore[no-untyped-def]
    operator = make_token("operator")
    replay(cli_env, live_server, operator, str(real_data / H100), "vision-h100", "n1", "vision")
    r = httpx.post(f"{live_server}/api/v1/jobs", headers=auth(operator), timeout=30,
                   json={"job_id": "xss-job", "team": "nlp", "name": XSS, "state": "finished",
                         "started_at": 1784016758.0, "ended_at": 1784016800.0})
    r.raise_for_status()
    report = httpx.get(f"{live_server}/api/v1/jobs/vision-h100/report", headers=auth(operator), timeout=60).json()
    return {"operator": operator, "vision": make_token("team", team="vision"), "report": report}


def _wait(driver, css: str, text: str | None = None, timeout_s: float = TIMEOUT_S):  # type: ignore[no-untyped-def]
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    wait = WebDriverWait(driver, timeout_s)
    if text is None:
        return wait.until(ec.visibility_of_element_located((By.CSS_SELECTOR, css)))
    wait.until(ec.text_to_be_present_in_element((By.CSS_SELECTOR, css), text))
    return driver.find_element(By.CSS_SELECTOR, css)


def _fresh_session(driver, url: str) -> None:  # type: ignore[no-untyped-def]
    driver.get(f"{url}/signin")  # drop any earlier session: its cookie and the tab's store
    driver.delete_all_cookies()
    driver.execute_script("window.sessionStorage.clear()")


def _sign_in(driver, url: str, token: str, expect: str) -> None:  # type: ignore[no-untyped-def]
    from dashboard.session import COOKIE

    _fresh_session(driver, url)
    driver.get(f"{url}/?token={token}")
    _wait(driver, "#whoami", expect)
    assert "token=" not in driver.current_url  # the token leaves the address bar
    cookie = driver.get_cookie(COOKIE)  # ... for a cookie page scripts cannot read
    assert cookie["httpOnly"] is True and cookie["sameSite"] == "Strict" and cookie["value"] == token
    assert token not in driver.execute_script("return document.cookie + JSON.stringify(window.sessionStorage)")


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
        # goodput (the fleet's allocated hours, or why there are none) and the GPUs needing attention
        goodput = summary.json()["goodput"]
        _wait(driver, "#fleet-goodput", fmt.hours(goodput["allocated_gpu_hours"]) if goodput else "no job's GPU time")
        attention = summary.json()["gpus_needing_attention"]
        _wait(driver, "#fleet-attention", attention[0]["gpu_uuid"] if attention else "no GPU needs attention")
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
    findings = (seeded["report"].get("health") or {}).get("findings")
    _wait(driver, "#job-health-card", findings[0]["summary"] if findings else "no findings on")

    _click_link(driver, "Nodes")
    _wait(driver, "#nodes-list", "n1")
    _click_link(driver, "n1")
    _wait(driver, "#node-gpus", "NVIDIA H100 80GB HBM3")
    _wait(driver, "#node-detail", "GPUs needing attention (last hour)")
    header = [c.text for c in driver.find_elements(By.CSS_SELECTOR, "#node-gpus th")]
    first = [c.text for c in driver.find_elements(By.CSS_SELECTOR, "#node-gpus tbody tr:first-child td")]
    assert first[header.index("MIG device")] == "no"  # a whole GPU: known, so not "unknown"

    _click_link(driver, "Estimator")
    _wait(driver, "#est-submit").click()
    # An answer, or the clear "not available" notice. The estimate runs PyTorch in a child process: its start
    # alone took over 20 s once while the machine was busy, so this wait is longer than the others.
    _wait(driver, "#est-result div", timeout_s=90)
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
    _fresh_session(driver, dashboard_url)
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
    from dashboard.session import COOKIE

    assert driver.get_cookie(COOKIE)["httpOnly"] is True
    driver.refresh()  # the session outlives a reload (the cookie, not the page's memory, holds it)
    _wait(driver, "#jobs-list", "vision-h100")
    driver.find_element(By.ID, "signout").click()
    _wait(driver, "#whoami", "not signed in")
    assert driver.get_cookie(COOKIE) is None
    driver.get(f"{dashboard_url}/jobs")
    _wait(driver, "#jobs-table", "Not signed in")


# ------------------------------------------------------------------------------------------------ job page parts

HOOKS_SAMPLES_S = 1200
HOOKS_STEPS = 150


def _post_gz(url: str, token: str, payload: object) -> None:
    r = httpx.post(url, content=gz(payload), timeout=60,
                   headers={**auth(token), "Content-Encoding": "gzip", "Content-Type": "application/json"})
    assert r.status_code < 300, r.text


@pytest.fixture
def hooks_job(live_server, make_token, real_data):  # type: ignore[no-untyped-def]
    """A finished 2-GPU job of team vision: NVML telemetry with the energy counter, the framework hooks' steps
    and layer timings, and an allocation trace (so that its report carries offset and swap plans). Plus a node
    without an energy counter, so that the fleet's energy has two sources."""
    team, operator = make_token("team", team="vision"), make_token("operator")
    t0 = time.time() - 7200
    for node, counter in (("hooks-node", True), ("old-node", False)):
        batch = sample_batch(node=node, agent_id=f"agent-{node}", n=HOOKS_SAMPLES_S, gpus=2, t0=t0)
        if counter:  # NVML total-energy counter, J, per GPU
            batch["samples"]["energy_counter_j"] = [1e6 + 150.0 * (j // 2) for j in range(len(batch["samples"]["ts"]))]
        _post_gz(f"{live_server}/api/v1/ingest/samples", make_token("agent", node=node), batch)
    uuids = ["GPU-hooks-node-0", "GPU-hooks-node-1"]
    # registered by an operator: a team token may attach only GPUs the agent attributed to it (issue 15)
    r = httpx.post(f"{live_server}/api/v1/jobs", headers=auth(operator), timeout=30, json={
        "job_id": "hooks-job", "team": "vision", "node": "hooks-node", "gpu_uuids": uuids, "state": "finished",
        "started_at": t0, "ended_at": t0 + HOOKS_SAMPLES_S - 1, "name": "resnet with hooks", "batch_size": 32})
    r.raise_for_status()
    events = []
    for rank in (0, 1):
        for step in range(HOOKS_STEPS):
            ts = t0 + 6.0 * (step + 1)
            events.append({"kind": "step", "job_id": "hooks-job", "rank": rank, "step": step, "ts": ts,
                           "wall_s": 6.0 + 0.01 * (step % 7) + 0.02 * rank, "samples": 32,
                           "allocated_peak_bytes": (400 + step % 50) * 2**20, "reserved_peak_bytes": 600 * 2**20,
                           "memory_source": "cuda_allocator"})
            if step % 50 == 0:
                events += [{"kind": "layer", "job_id": "hooks-job", "rank": rank, "step": step, "ts": ts,
                            "module": m, "module_type": "Conv2d", "forward_s": f, "backward_s": 2 * f,
                            "activation_bytes": 2**20, "calls": 1} for m, f in (("conv1", 0.2), ("layer1", 0.5))]
    _post_gz(f"{live_server}/api/v1/ingest/events", team,
             {"protocol_version": 1, "source_id": "hooks", "seq": 0, "sent_at": time.time(), "events": events})
    trace = (real_data / ALLOCATION_TRACE).read_bytes()
    r = httpx.post(f"{live_server}/api/v1/jobs/hooks-job/traces", content=trace, timeout=120,
                   params={"filename": "df_index_resolver.json.gz"},
                   headers={**auth(team), "Content-Type": "application/gzip"})
    assert r.status_code == 200, r.text
    report = httpx.get(f"{live_server}/api/v1/jobs/hooks-job/report", params={"refresh": "true"},
                       headers=auth(team), timeout=120).json()
    return {"team": team, "operator": operator, "t0": t0, "report": report, "trace_bytes": len(trace),
            "real_data": real_data}


PLOT_JS = """
const gd = document.querySelector('#' + arguments[0] + ' .js-plotly-plot');
if (!gd || !gd._fullData || !gd._fullLayout) return null;
const xa = gd._fullLayout.xaxis;
return {
  traces: gd._fullData.map(t => {
    const x = t.x ? Array.from(t.x).filter(v => v !== null && !Number.isNaN(v)) : [];
    return {name: t.name, type: t.type, n: x.length, xmin: x.length ? Math.min(...x) : null,
            xmax: x.length ? Math.max(...x) : null};
  }),
  shapes: (gd._fullLayout.shapes || []).length,
  title: gd._fullLayout.title.text, subtitle: (gd._fullLayout.title.subtitle || {}).text,
  range: xa && xa.range ? [xa.r2l(xa.range[0]), xa.r2l(xa.range[1])] : null,
};
"""


def _has_points(p: dict) -> bool:
    return bool(p["traces"]) and all(t["n"] >= 2 for t in p["traces"])


def _plot(driver, graph: str, ready=_has_points):  # type: ignore[no-untyped-def]
    """The drawn state of a plot (decoded traces, shapes, title, x range in epoch ms), once `ready` holds."""
    from selenium.webdriver.support.ui import WebDriverWait

    state: dict = {}

    def check(d) -> bool:  # type: ignore[no-untyped-def]
        p = d.execute_script(PLOT_JS, graph)
        state["plot"] = p
        return p is not None and ready(p)

    try:
        WebDriverWait(driver, 30).until(check)
    except Exception as exc:  # the last state seen says what was missing
        raise AssertionError(f"{graph}: {state.get('plot')}") from exc
    return state["plot"]


def test_job_page_has_every_part(chrome, dashboard_url, hooks_job, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Memory (NVML vs allocator vs capacity), power, utilization, step times, layers, energy with its source,
    recommendations with reasons, optimization plans and the HTML report download."""
    from selenium.webdriver.common.by import By

    driver = chrome
    driver.get_log("browser")
    driver.execute_cdp_cmd("Page.setDownloadBehavior", {"behavior": "allow", "downloadPath": str(tmp_path)})
    _sign_in(driver, dashboard_url, hooks_job["team"], "team")
    driver.get(f"{dashboard_url}/jobs/hooks-job")

    memory = _plot(driver, "job-memory")
    names = [t["name"] for t in memory["traces"]]
    assert {"NVML used · GPU 0", "NVML used · GPU 1"} <= set(names)
    assert names.count("allocator allocated (step peak)") == 2 and names.count("allocator reserved (step peak)") == 2
    assert memory["shapes"] >= 1  # the capacity line
    for graph in ("job-power", "job-util"):
        assert [t["name"] for t in _plot(driver, graph)["traces"]] == ["GPU 0", "GPU 1"]
    hist = _plot(driver, "job-step-hist")
    assert hist["traces"][0]["type"] == "bar" and f"{HOOKS_STEPS:,} steps" in hist["title"]
    assert [t["name"] for t in _plot(driver, "job-layer-bars")["traces"]] == ["forward", "backward"]

    report = hooks_job["report"]
    _wait(driver, "#job-steps-value", f"{HOOKS_STEPS} steps")
    peak_allocated = fmt.gib(report["memory"]["peak_allocated_bytes"])
    assert driver.find_element(By.ID, "job-peak-allocated-value").text == peak_allocated
    assert "PyTorch caching allocator" in driver.find_element(By.ID, "job-peak-allocated").text  # its source
    _wait(driver, "#job-energy-source", fmt.energy_source(report["energy"]["source"]))
    assert report["energy"]["source"] == "hardware_counter"
    _wait(driver, "#job-recommendations", "why: ")
    _wait(driver, "#job-offset-plan", "lower bound")
    plan = report["optimization"]["offset_plan"]
    assert fmt.gib(plan["planned_bytes"]) in driver.find_element(By.ID, "job-offset-plan").text
    _wait(driver, "#job-swap-plan", "Offloading")
    bars = _plot(driver, "job-plan-bars", lambda p: bool(p["traces"]))
    assert bars["traces"][0]["type"] == "bar" and bars["title"].startswith("Peak device memory under each plan")
    _wait(driver, "#job-layers", "conv1")
    # the other GPU types (right-sizing's projections): no other run of the model here, the datasheets' ratios
    _wait(driver, "#job-other-gpus-table", "datasheets and this run's telemetry")

    driver.find_element(By.ID, "job-download-button").click()
    target = tmp_path / "fleetprof-report-hooks-job.html"
    deadline = time.monotonic() + 30
    while not target.exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    page = target.read_text()
    assert page.startswith("<") and "hooks-job" in page and "</html>" in page

    # the Downloads card: the uploaded Kineto trace comes back byte for byte through its link
    _wait(driver, "#job-downloads", "Kineto trace")
    link = driver.find_element(By.CSS_SELECTOR, "#job-downloads a.job-download-trace")
    assert link.text == "df_index_resolver.json.gz"
    link.click()
    got = tmp_path / "df_index_resolver.json.gz"
    deadline = time.monotonic() + 60
    while not (got.exists() and got.stat().st_size == hooks_job["trace_bytes"]) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert got.read_bytes() == (hooks_job["real_data"] / ALLOCATION_TRACE).read_bytes()
    assert _console_errors(driver) == []


def _relayout(driver, graph: str, update: dict) -> None:  # type: ignore[no-untyped-def]
    driver.execute_script("Plotly.relayout(document.querySelector('#' + arguments[0] + ' .js-plotly-plot'), "
                          "arguments[1]);", graph, update)


def _outputs(driver, name: str) -> int:  # type: ignore[no-untyped-def]
    """How many Dash callback requests this page made for an output."""
    return driver.execute_script("return window.__fpCalls.filter(c => String(c.output).includes(arguments[0]))"
                                 ".length;", name)


def test_zoom_refetches_every_time_plot_for_the_range(chrome, dashboard_url, hooks_job) -> None:  # type: ignore[no-untyped-def]
    from datetime import datetime

    driver = chrome
    probe = driver.execute_cdp_cmd("Page.addScriptToEvaluateOnNewDocument", {"source": PAGE_PROBE_JS})
    try:
        _sign_in(driver, dashboard_url, hooks_job["team"], "team")
        driver.get(f"{dashboard_url}/jobs/hooks-job")
        full = {g: _plot(driver, g) for g in ("job-memory", "job-power", "job-util")}
        _wait(driver, "#job-energy-source", "NVML")
        # one request per part of the page: no second fetch when the plots first size themselves
        assert _outputs(driver, "job-memory.figure") == 1 and _outputs(driver, "job-summary.children") == 1

        t0 = hooks_job["t0"]
        lo, hi = t0 + 300.0, t0 + 600.0  # a 5-minute window of the 20-minute job

        def utc(ts: float) -> str:  # as plotly reports a drag on a date axis
            return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]

        _relayout(driver, "job-memory", {"xaxis.range[0]": utc(lo), "xaxis.range[1]": utc(hi)})

        def zoomed(p: dict) -> bool:
            return p["range"] is not None and abs(p["range"][0] - lo * 1e3) < 1000 \
                and abs(p["range"][1] - hi * 1e3) < 1000 and all(t["n"] >= 2 for t in p["traces"])

        for graph in ("job-power", "job-util", "job-memory"):  # the untouched plots follow the zoom
            p = _plot(driver, graph, zoomed)
            for t in p["traces"]:  # fetched again for the range, not just zoomed in the browser
                assert t["xmin"] >= lo * 1e3 - 1000 and t["xmax"] <= hi * 1e3 + 1000, (graph, t)
            assert sum(t["n"] for t in p["traces"]) < sum(t["n"] for t in full[graph]["traces"])
        assert _outputs(driver, "job-memory.figure") == 2

        _relayout(driver, "job-power", {"xaxis.autorange": True})  # double-click: the whole job again
        p = _plot(driver, "job-util", lambda p: p["range"] is not None and p["range"][1] - p["range"][0] > 900e3)
        assert sum(t["n"] for t in p["traces"]) == sum(t["n"] for t in full["job-util"]["traces"])
        assert _outputs(driver, "job-memory.figure") == 3
    finally:
        driver.execute_cdp_cmd("Page.removeScriptToEvaluateOnNewDocument", {"identifier": probe["identifier"]})


def test_fleet_energy_says_where_it_came_from(chrome, dashboard_url, hooks_job, live_server, db_session) -> None:  # type: ignore[no-untyped-def]
    """The energy plot and KPI name the source the API reports per hour (counter vs integrated power)."""
    from dashboard import figures
    from server.fleet.service import rollup_hours

    t0 = hooks_job["t0"]
    rollup_hours(db_session, since=t0, until=t0 + HOOKS_SAMPLES_S)
    db_session.commit()
    timeline = httpx.get(f"{live_server}/api/v1/fleet/timeline", headers=auth(hooks_job["operator"]),
                         timeout=30).json()
    assert {"hardware_counter", "integrated_power"} <= set(timeline["energy_by_source_j"])
    expected = figures.energy_source_shares(timeline)
    assert "NVML energy counter" in expected and "integrated power" in expected

    driver = chrome
    driver.get_log("browser")
    _sign_in(driver, dashboard_url, hooks_job["operator"], "operator")
    energy = _plot(driver, "fleet-energy", lambda p: len(p["traces"]) >= 2)
    assert energy["subtitle"] == f"source: {expected}"
    assert {t["name"] for t in energy["traces"]} == {"NVML energy counter", "integrated power"}
    _wait(driver, "#kpi-energy", expected)
    assert _console_errors(driver) == []


# ------------------------------------------------------------------------------------------------ compare

APPLY_SCRIPT = "import os; print('ALLOC', os.environ.get('PYTORCH_CUDA_ALLOC_CONF'))"


def _fleetprof_run(env: dict[str, str], job_id: str, *flags: str) -> str:
    import subprocess
    import sys

    from tests.e2e.conftest import FLEETPROF

    proc = subprocess.run([*FLEETPROF, "run", "--job-id", job_id, "--name", "browser-apply", "--no-hooks", *flags,
                           "--", sys.executable, "-c", APPLY_SCRIPT], env=env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


@pytest.fixture
def applied_runs(live_server, make_token, cli_env, real_data):  # type: ignore[no-untyped-def]
    """Two CPU runs of one name: the first with the real Kineto memory trace uploaded (so its report recommends an
    allocator setting, by simulation), the second started with `fleetprof run --apply` of the first."""
    from tests.e2e.conftest import client_env

    team = make_token("team", team="browser-apply")
    env = client_env(cli_env, live_server, team)
    _fleetprof_run(env, "apply-before")
    r = httpx.post(f"{live_server}/api/v1/jobs/apply-before/traces", content=(real_data / ALLOCATION_TRACE).read_bytes(),
                   params={"filename": "df_index_resolver.json.gz"},
                   headers={**auth(team), "Content-Type": "application/gzip"}, timeout=120)
    assert r.status_code == 200, r.text
    report = httpx.get(f"{live_server}/api/v1/jobs/apply-before/report", headers=auth(team), timeout=120).json()
    [rec] = [r for r in report["recommendations"] if r["kind"] == "allocator_settings"]
    assert rec["saving"]["reserved_bytes"] > 0
    setting = rec["evidence"]["env"]
    assert f"ALLOC {setting.partition('=')[2]}" in _fleetprof_run(env, "apply-after", "--apply", "apply-before")
    return {"team": team, "rec": rec, "setting": setting, "report": report}


def test_job_page_links_to_compare_with_predicted_and_realized(chrome, dashboard_url, applied_runs) -> None:  # type: ignore[no-untyped-def]
    """From the first run's page to the comparison with the run that applied its allocator recommendation: the
    predicted saving (with its unit and where it came from) and the realized one, unknown for a CPU run."""
    from selenium.webdriver.common.by import By

    driver = chrome
    driver.get_log("browser")
    _sign_in(driver, dashboard_url, applied_runs["team"], "team")
    driver.get(f"{dashboard_url}/jobs/apply-before")
    _wait(driver, "#job-compare", "compare with apply-after")
    assert "applied this run's allocator_settings" in driver.find_element(By.ID, "job-compare").text
    _click_link(driver, "compare with apply-after")

    applied = _wait(driver, "#compare-applied", applied_runs["setting"])
    assert "/compare?ids=apply-before,apply-after" in driver.current_url
    header = [c.text for c in applied.find_elements(By.CSS_SELECTOR, "th")]
    [row] = applied.find_elements(By.CSS_SELECTOR, "tbody tr")
    cells = dict(zip(header, [c.text for c in row.find_elements(By.CSS_SELECTOR, "td")], strict=True))
    saving = applied_runs["rec"]["saving"]
    assert cells["run"] == "apply-after" and cells["from job"] == "apply-before"
    assert cells["kind"] == "allocator_settings" and cells["setting"] == applied_runs["setting"]
    assert cells["predicted saving"] == (f"reserved_bytes: {fmt.size(saving['reserved_bytes'])}, "
                                         f"reserved_pct: {fmt.pct(saving['reserved_pct'])}")
    assert cells["predicted by"].startswith("apply-before's report: its allocator_settings recommendation")
    # the CPU run without hooks measured no reserved peak: unknown, never 0
    before = fmt.size(applied_runs["report"]["memory"]["peak_reserved_bytes"])
    assert cells["realized saving"] == (f"peak_reserved_bytes: unknown (this run did not measure it; "
                                        f"apply-before {before}, this run unknown)")
    assert cells["measured from"] == "the runs' reports (peak_reserved_bytes), this run against apply-before"
    _wait(driver, "#compare-runs", "apply-after")

    # and back: the second run's page links to the run it applied the recommendation from
    _click_link(driver, "apply-after")
    _wait(driver, "#job-compare", "compare with apply-before")
    assert "the run it applied allocator_settings from" in driver.find_element(By.ID, "job-compare").text

    # the jobs list: tick both runs, compare them
    driver.get(f"{dashboard_url}/jobs")
    _wait(driver, "#jobs-list", "apply-after")
    for box in driver.find_elements(By.CSS_SELECTOR, "#jobs-list .pick input"):
        box.click()
    _wait(driver, "#jobs-compare-hint", "2 runs, the first (apply-before) the baseline")
    driver.find_element(By.ID, "jobs-compare").click()
    _wait(driver, "#compare-applied", applied_runs["setting"])
    assert _console_errors(driver) == []


def test_capture_a_running_job_from_its_page(chrome, dashboard_url, live_server, make_token) -> None:  # type: ignore[no-untyped-def]
    """Issue #19: the Capture control POSTs with the signed-in token, the capture is listed `requested` (and the
    API has it); a finished job offers no control, and a job that ended after the page opened gets the API's 409."""
    from selenium.webdriver.common.by import By

    team = make_token("team", team="nlp")
    for job_id, state in (("cap-live", "running"), ("cap-over", "finished"), ("cap-ends", "running")):
        r = httpx.post(f"{live_server}/api/v1/jobs", headers=auth(team), timeout=30,
                       json={"job_id": job_id, "state": state, "started_at": time.time() - 60})
        assert r.status_code == 200, r.text

    def listed(job_id: str) -> list[dict]:
        r = httpx.get(f"{live_server}/api/v1/jobs/{job_id}/captures", headers=auth(team), timeout=30)
        assert r.status_code == 200, r.text
        return r.json()["captures"]

    driver = chrome
    driver.get_log("browser")
    _sign_in(driver, dashboard_url, team, "team")
    driver.get(f"{dashboard_url}/jobs/cap-live")
    _wait(driver, "#job-captures-list", "no captures of this job")
    button = _wait(driver, "#job-capture-button")
    from selenium.webdriver.support.ui import WebDriverWait

    WebDriverWait(driver, TIMEOUT_S).until(lambda d: d.find_element(By.ID, "job-capture-button").is_enabled())
    steps = driver.find_element(By.ID, "job-capture-steps")
    assert steps.get_attribute("value") == "5"
    steps.clear()
    steps.send_keys("7")
    button.click()
    _wait(driver, "#job-capture-state", "requested")
    _wait(driver, "#job-captures-list", "requested")
    [capture] = listed("cap-live")
    assert capture["state"] == "requested" and capture["kind"] == "kineto" and capture["steps"] == 7
    assert capture["requested_by"] == "team:nlp" and capture["trigger"]["kind"] == "manual"
    row = driver.find_element(By.ID, "job-captures-list").text
    assert capture["capture_id"] in row and "7 steps" in row and "manual" in row

    # a finished job: the control is there, disabled, with the reason; nothing can be requested
    driver.get(f"{dashboard_url}/jobs/cap-over")
    _wait(driver, "#job-capture-note", "only for a running job")
    assert "finished" in driver.find_element(By.ID, "job-capture-note").text
    assert not driver.find_element(By.ID, "job-capture-button").is_enabled()
    _wait(driver, "#job-captures-list", "no captures of this job")

    # a job that ends while its page is open: the API's refusal (409) is shown, nothing is created
    driver.get(f"{dashboard_url}/jobs/cap-ends")
    WebDriverWait(driver, TIMEOUT_S).until(lambda d: d.find_element(By.ID, "job-capture-button").is_enabled())
    r = httpx.post(f"{live_server}/api/v1/jobs", headers=auth(team), timeout=30,
                   json={"job_id": "cap-ends", "state": "finished", "ended_at": time.time()})
    assert r.status_code == 200, r.text
    driver.find_element(By.ID, "job-capture-button").click()
    error = _wait(driver, "#job-capture-error", "409")
    assert "only a running job can be captured" in error.text
    assert listed("cap-ends") == [] and listed("cap-over") == []
    assert _console_errors(driver) == []
