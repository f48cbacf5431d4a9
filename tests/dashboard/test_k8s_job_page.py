"""The dashboard opens a Kubernetes pod's job page (`k8s:ml/trainer-0`, fed by the real agent as in
tests/e2e/test_k8s_job.py) from the link in the jobs list, in a real headless Chromium."""

from __future__ import annotations

import pytest

from tests.dashboard.test_browser import _console_errors, _sign_in, _wait
from tests.e2e.test_k8s_job import JOB, k8s_job, pod_on_a_node  # noqa: F401 - fixtures

pytestmark = pytest.mark.browser


def test_the_dashboard_opens_the_pods_job_page_from_the_jobs_list(  # type: ignore[no-untyped-def]
        chrome, dashboard_url, k8s_job) -> None:  # noqa: F811 - the fixture imported above
    from selenium.webdriver.common.by import By

    driver = chrome
    driver.get_log("browser")
    _sign_in(driver, dashboard_url, k8s_job["operator"], "operator")
    driver.get(f"{dashboard_url}/jobs")
    _wait(driver, "#jobs-list", JOB)
    driver.find_element(By.LINK_TEXT, JOB).click()
    _wait(driver, "#job-title", JOB)
    assert driver.current_url.endswith("/jobs/k8s:ml%2Ftrainer-0")
    _wait(driver, "#job-meta", "k8s-node-1")  # the data callback fetched this job, on this node
    driver.get(f"{dashboard_url}/jobs/k8s:ml%2Ftrainer-0")  # the same address loaded anew (Flask serves it)
    _wait(driver, "#job-meta", "k8s-node-1")
    driver.get(f"{dashboard_url}/jobs/k8s:ml%2F..")
    _wait(driver, "#job-error", "is not a job id")
    assert _console_errors(driver) == []
