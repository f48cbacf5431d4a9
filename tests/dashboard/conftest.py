"""Browser fixtures: one headless Chromium per session, the dashboard served in a thread per test."""

from __future__ import annotations

import subprocess
import sys
import threading
from collections.abc import Iterator

import pytest

# Installed before any page script runs (Page.addScriptToEvaluateOnNewDocument): records each Dash callback
# request in window.__fpCalls (outputs, start/end in the page's clock, response size), how many are in flight,
# and each plotly draw in window.__fpPlots. Used by the browser tests and bench/dashboard.py.
PAGE_PROBE_JS = """
(() => {
  const orig = window.fetch;
  window.__fpCalls = []; window.__fpInflight = 0;
  window.fetch = async function(input, init) {
    const url = typeof input === 'string' ? input : input.url;
    if (!url.includes('_dash-update-component')) return orig.apply(this, arguments);
    const rec = {t0: performance.now(), output: '?'};
    try { const b = JSON.parse(init.body); rec.output = b.output; rec.changed = b.changedPropIds; } catch (e) {}
    window.__fpCalls.push(rec); window.__fpInflight++;
    try {
      const resp = await orig.apply(this, arguments);
      rec.status = resp.status; rec.t1 = performance.now();
      const text = await resp.clone().text();
      rec.bytes = text.length; rec.t2 = performance.now();
      return resp;
    } finally { setTimeout(() => { window.__fpInflight--; }, 0); }
  };
  // Plotly's own drawing time per call (plotly.js is loaded later, by the first graph)
  window.__fpPlots = [];
  let plotly;
  Object.defineProperty(window, 'Plotly', {configurable: true, get() { return plotly; }, set(v) {
    plotly = v;
    for (const name of ['react', 'newPlot']) {
      const orig = v[name];
      v[name] = function(gd) {
        const rec = {fn: name, id: (gd && gd.parentElement && gd.parentElement.id) || (gd && gd.id) || '?',
                     t0: performance.now()};
        window.__fpPlots.push(rec);
        const out = orig.apply(this, arguments);
        Promise.resolve(out).then(() => { rec.t1 = performance.now(); });
        return out;
      };
    }
  }});
})();
"""


CHROME_ARGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
               "--enable-unsafe-swiftshader", "--window-size=1400,1000")


def make_chrome():  # type: ignore[no-untyped-def]
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    for arg in CHROME_ARGS:
        options.add_argument(arg)
    options.binary_location = "/usr/bin/chromium"
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=options)


@pytest.fixture(scope="session")
def chrome() -> Iterator[object]:
    driver = make_chrome()
    yield driver
    driver.quit()


@pytest.fixture
def dashboard_url(live_server: str) -> Iterator[str]:
    """The dashboard (no default token: every visitor signs in) against the live API, in a thread."""
    from dashboard.server import serve_dashboard
    from tests.conftest import free_port, wait_http

    port = free_port()
    stop = threading.Event()
    thread = threading.Thread(target=serve_dashboard, args=("127.0.0.1", port, live_server, None, stop), daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    wait_http(url + "/_dash-layout")
    yield url
    stop.set()
    thread.join(10)


def replay(cli_env: dict[str, str], server: str, token: str, path: str, job_id: str, node: str, team: str) -> None:
    env = {**cli_env, "FLEETPROF_SERVER_URL": server, "FLEETPROF_TOKEN": token}
    done = subprocess.run([sys.executable, "-m", "fleetprof.cli", "replay", path, "--job-id", job_id, "--node", node,
                           "--team", team], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
