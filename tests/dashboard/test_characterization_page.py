"""The compare page's "one model across configurations" and the jobs page's grouping by model (pure views), and
both in a real headless Chromium over real `fleetprof run` CPU runs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from plotly.utils import PlotlyJSONEncoder

from dashboard.figures import configuration_bars, configuration_label
from dashboard.pages.compare import characterization_href, characterization_view
from dashboard.pages.jobs import grouped_by_model, job_rows
from fleetprof.api_models import JobRead
from server.analysis.configurations import characterize_configurations
from tests.analysis.test_configurations import FP, GIB, _run

SCRIPTS = Path(__file__).parents[1] / "hooks" / "scripts"


def _text(components) -> str:  # type: ignore[no-untyped-def]
    return json.dumps(components, cls=PlotlyJSONEncoder, ensure_ascii=False)


def _out():  # type: ignore[no-untyped-def]
    return characterize_configurations([
        _run("a", gpu="A100-80GB", step_s=0.2, batch=64, energy_per_step_j=60.0, peak=20 * GIB),
        _run("bf", gpu="A100-80GB", step_s=0.12, batch=64, precision="amp_bf16", energy_per_step_j=33.0,
             peak=14 * GIB),
        _run("cpu", gpu=None, step_s=2.0, batch=64, peak=3 * GIB, device="cpu"),
    ], fingerprint=FP)


def test_characterization_view_table_plots_and_findings() -> None:
    out = _out()
    text = _text(characterization_view(out))
    assert "characterization-configurations" in text and f"fingerprint {FP}" in text
    assert "amp_bf16 vs fp32 (precision) on the same 1x A100-80GB" in text
    (finding,) = [f for f in out.findings if f.axis == "precision"]
    assert finding.summary in text
    assert "unknown" in text  # the CPU run's energy and cost: unknown, never 0
    for key in ("samples_per_s", "energy_per_sample_j", "step_time_s"):
        assert f"characterization-{key}" in text


def test_configuration_bars_name_unknown_configurations() -> None:
    out = _out()
    fig = configuration_bars(out.configurations, figure="energy_per_sample_j", title="t", y_title="J/sample")
    labels = [configuration_label(c) for c in out.configurations]
    assert list(fig.data[0].x) == labels
    cpu = next(c for c in out.configurations if c.gpu_type == "cpu")
    assert "unknown for " + configuration_label(cpu) in fig.layout.title.subtitle.text
    empty = configuration_bars(out.configurations, figure="mfu_fraction", title="t", y_title="fraction")
    assert "unknown for every configuration" in empty.layout.annotations[0].text


def _job(job_id: str, fp: str | None, model: str | None = "__main__.ConvNet") -> JobRead:
    return JobRead(job_id=job_id, team="t", name=None, command=None, framework=None, host=None, user=None, node=None,
                   state="finished", batch_size=None, gpu_type_requested=None, gpus_requested=None, exit_code=None,
                   created_at=0.0, updated_at=0.0, started_at=None, ended_at=None, duration_s=None, gpu_uuids=[],
                   metadata={"framework": {"model_class": model}} if model else {}, fingerprint=fp)


def test_jobs_grouped_by_model() -> None:
    items = [_job("a1", "a" * 20), _job("n1", None, None), _job("b1", "b" * 20, "__main__.Other"),
             _job("a2", "a" * 20)]
    text = _text(grouped_by_model(items))
    assert text.index("ConvNet · " + "a" * 20 + " · 2 run(s)") < text.index("Other · " + "b" * 20 + " · 1 run(s)") \
        < text.index("no fingerprint")
    assert characterization_href("a" * 20) in text and "/jobs?fingerprint=" + "a" * 20 in text
    assert "ConvNet · aaaaaaaa" in _text(job_rows([items[0]]))


@pytest.mark.browser
def test_model_runs_grouped_and_characterized_in_the_browser(chrome, dashboard_url, live_server, make_token,
                                                            cli_env) -> None:  # type: ignore[no-untyped-def]
    from selenium.webdriver.common.by import By

    from tests.dashboard.test_browser import _console_errors, _sign_in, _wait
    from tests.e2e.conftest import FLEETPROF, client_env

    team = make_token("team", team="browser-fp")
    env = client_env(cli_env, live_server, team)
    for job_id, script, args in (("bfp-b8", "train_loader.py", ("8", "3")), ("bfp-b16", "train_loader.py", ("16", "3")),
                                 ("bfp-cnn", "train_cnn.py", ("3",))):
        proc = subprocess.run([*FLEETPROF, "run", "--job-id", job_id, "--", sys.executable, str(SCRIPTS / script),
                               *args], env=env, capture_output=True, text=True, timeout=180)
        assert proc.returncode == 0, proc.stderr

    driver = chrome
    driver.get_log("browser")
    _sign_in(driver, dashboard_url, team, "team")
    driver.get(f"{dashboard_url}/jobs")
    _wait(driver, "#jobs-list", "bfp-cnn")
    driver.find_element(By.CSS_SELECTOR, "#jobs-group input").click()
    groups = _wait(driver, "#jobs-list", "ConvNet")
    _wait(driver, "#jobs-list", "SmallCNN")
    heads = [h.text for h in groups.find_elements(By.CSS_SELECTOR, "h4")]
    assert any(h.startswith("ConvNet") and "2 run(s)" in h for h in heads), heads
    assert any(h.startswith("SmallCNN") and "1 run(s)" in h for h in heads), heads
    convnet = next(g for g in groups.find_elements(By.CSS_SELECTOR, ".jobs-group") if "ConvNet" in g.text)
    convnet.find_element(By.LINK_TEXT, "across configurations").click()

    table = _wait(driver, "#characterization-configurations", "bfp-b16")
    assert "/compare?fingerprint=" in driver.current_url
    rows = table.find_elements(By.CSS_SELECTOR, "tbody tr")
    assert len(rows) == 2 and "bfp-cnn" not in table.text
    _wait(driver, "#characterization-findings", "batch 16 vs batch 8 (batch_size)")
    assert "samples/s" in driver.find_element(By.ID, "characterization-findings").text
    _wait(driver, "#characterization-samples_per_s .main-svg")

    # a run's page names its fingerprint and links to the same view
    driver.get(f"{dashboard_url}/jobs/bfp-cnn")
    framework = _wait(driver, "#job-framework", "this model across configurations")
    fp = framework.find_element(By.LINK_TEXT, "this model across configurations").get_attribute("href")
    assert fp.split("fingerprint=")[1] in framework.text
    assert _console_errors(driver) == []
