"""The dashboard's compare view: the applied recommendations with predicted and realized saving, every figure with
its unit, unknown as "unknown"."""

from __future__ import annotations

import json

from plotly.utils import PlotlyJSONEncoder

from dashboard.pages.compare import _predicted, compare_href, compare_view, split_ids
from dashboard.pages.job import compare_links
from dashboard.pages.jobs import compare_selection
from fleetprof.api_models import JobRead
from server.analysis.compare import compare_runs

GIB = 2**30
APPLIED = {"kind": "allocator_settings", "summary": "Set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True",
           "predicted_saving": {"reserved_bytes": 8 * GIB, "reserved_pct": 25.0}, "from_job": "before",
           "setting": "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"}


def _text(components) -> str:  # type: ignore[no-untyped-def]
    return json.dumps(components, cls=PlotlyJSONEncoder)


def test_applied_table_shows_predicted_and_realized():
    before = {"job_id": "before", "memory": {"peak_reserved_bytes": 32 * GIB}}
    after = {"job_id": "after", "memory": {"peak_reserved_bytes": 24 * GIB}}
    out = compare_runs([({"job_id": "before"}, before), ({"job_id": "after", "applied": [APPLIED]}, after)])
    text = _text(compare_view(out))
    assert "compare-applied" in text and "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True" in text
    assert "reserved_bytes: 8.00 GiB, reserved_pct: 25.0 %" in text
    assert "peak_reserved_bytes: 8.00 GiB less than before (25.0 %)" in text


def test_no_applied_recommendation_says_so():
    out = compare_runs([({"job_id": "a"}, {"job_id": "a"}), ({"job_id": "b"}, {"job_id": "b"})])
    text = _text(compare_view(out))
    assert "no run applied a recommendation" in text and "unknown" in text


def test_unknown_realized_saving_says_which_run_did_not_measure_it():
    before = {"job_id": "before", "memory": {"peak_reserved_bytes": 32 * GIB}}
    after = {"job_id": "after", "memory": {}}
    out = compare_runs([({"job_id": "before"}, before), ({"job_id": "after", "applied": [APPLIED]}, after)])
    text = _text(compare_view(out))
    assert "peak_reserved_bytes: unknown (this run did not measure it; before 32.00 GiB, this run unknown)" in text
    assert "0 B" not in text
    assert "before's report: its allocator_settings recommendation" in text  # where the prediction came from
    assert "the runs' reports (peak_reserved_bytes), this run against before" in text


def test_predicted_saving_unknown_when_the_recommendation_gave_none():
    out = compare_runs([({"job_id": "a"}, {"job_id": "a"}),
                        ({"job_id": "b", "applied": [{**APPLIED, "predicted_saving": None}]}, {"job_id": "b"})])
    [applied] = out.jobs[1].applied
    assert _predicted(applied.predicted_saving) == "unknown"


def test_compare_href_quotes_each_id():
    assert compare_href(["a/b", "c+d"]) == "/compare?ids=a%2Fb,c%2Bd"
    assert split_ids(" a, ,b ") == ["a", "b"]


def _job(job_id: str, started: float, *, name: str | None = "nightly", applied: list | None = None) -> JobRead:
    return JobRead(job_id=job_id, team="t", name=name, command=None, framework=None, host=None, user=None, node=None,
                   state="finished", batch_size=None, gpu_type_requested=None, gpus_requested=None, exit_code=None,
                   created_at=started, updated_at=started, started_at=started, ended_at=None, duration_s=None,
                   gpu_uuids=[], metadata={"applied": applied} if applied else {})


def _links(div) -> list[tuple[str, str]]:  # type: ignore[no-untyped-def]
    items = div.children[1].children
    return [(li.children[0].children, li.children[0].href) if isinstance(li.children, list)
            else (li.children.children, li.children.href) for li in items]


def test_job_page_compare_links():
    applied = [{"kind": "allocator_settings", "from_job": "run-1"}]
    job = _job("run-2", 200.0, applied=applied)
    same_name = [_job("run-3", 300.0, applied=[{"kind": "batch_size", "from_job": "run-2"}]), job,
                 _job("run-1", 100.0), _job("run-0", 50.0), _job("other", 150.0, name="nightly-2")]
    assert _links(compare_links(job, same_name)) == [
        ("compare with run-1", "/compare?ids=run-1,run-2"),  # what it applied (and its previous run: once)
        ("compare with run-3", "/compare?ids=run-2,run-3"),  # a later run that applied this one's advice
        ("compare with another run", "/compare?ids=run-2"),
    ]
    assert _links(compare_links(_job("solo", 1.0, name=None), [])) == [("compare with another run",
                                                                        "/compare?ids=solo")]


def test_jobs_list_selection():
    assert compare_selection([["new"], [], None])[1] == {"display": "none"}  # one run: nothing to compare
    href, style, hint = compare_selection([["new"], [], ["old"]])
    assert href == "/compare?ids=old,new" and style == {} and "the first (old) the baseline" in hint
