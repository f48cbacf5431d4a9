"""Browser fixtures: one headless Chromium per session, the dashboard served in a thread per test."""

from __future__ import annotations

import subprocess
import sys
import threading
from collections.abc import Iterator

import pytest

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
