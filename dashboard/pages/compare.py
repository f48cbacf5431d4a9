"""Compare runs (`/compare?ids=a,b`): the runs side by side against the first, and for each run the recommendations
it applied (`fleetprof run --apply`) with the predicted saving next to the realized one."""

from __future__ import annotations

from typing import Any

import dash
from dash import Input, Output, dcc, html

from dashboard import format as fmt
from dashboard.client import ApiError
from dashboard.components import client_for, error_box, job_link, section, table
from dashboard.session import AuthStore
from fleetprof.api_models import AppliedRecommendation, CompareOut


def layout(ids: str | None = None, **_: Any) -> html.Div:
    return html.Div([
        dcc.Store(id="compare-ids", data=ids or ""),
        html.H2("Compare runs"),
        dcc.Loading(html.Div(id="compare-view"), type="dot"),
    ])


def _predicted(saving: dict[str, Any] | None) -> str:
    if not saving:
        return fmt.UNKNOWN
    return ", ".join(f"{k}: {fmt.by_key(k, v)}" for k, v in saving.items()
                     if v is None or isinstance(v, (int, float)))


def _realized(item: AppliedRecommendation) -> str:
    if not item.realized:
        return fmt.UNKNOWN
    return "; ".join(f"{r.figure}: {fmt.by_key(r.figure, r.saving)} less than {r.against_job_id}"
                     + (f" ({r.saving_pct:.1f} %)" if r.saving_pct is not None else "") for r in item.realized)


def compare_view(out: CompareOut) -> list[html.Section]:
    """The comparison as sections: runs, applied recommendations, findings (pure: data in, components out)."""
    runs = [[job_link(r.job_id), fmt.text(r.gpu_name), fmt.count(r.gpu_count, "GPUs"), fmt.count(r.batch_size),
             fmt.seconds(r.step_time_p50_s), fmt.size(r.peak_reserved_bytes), fmt.by_key("energy_per_step_j",
                                                                                         r.energy_per_step_j)]
            for r in out.jobs]
    applied = [[job_link(r.job_id), a.kind, fmt.text(a.setting), fmt.text(a.from_job), _predicted(a.predicted_saving),
                _realized(a)] for r in out.jobs for a in r.applied]
    return [
        section("Runs", table(["job", "GPU", "count", "batch", "step time p50", "peak reserved", "energy per step"],
                              runs, id="compare-runs")),
        section("Applied recommendations", table(["run", "kind", "setting", "from job", "predicted saving",
                                                  "realized saving"], applied, id="compare-applied",
                                                 empty="no run applied a recommendation (fleetprof run --apply)")),
        section("Findings", html.Ul([html.Li(f) for f in out.findings], id="compare-findings")),
    ]


def register_callbacks(app: dash.Dash) -> None:
    @app.callback(Output("compare-view", "children"), Input("compare-ids", "data"), Input("auth", "data"))
    def _compare(ids: str, auth: AuthStore | None):
        job_ids = [i.strip() for i in (ids or "").split(",") if i.strip()]
        if len(job_ids) < 2:
            return error_box("name two or more runs: /compare?ids=a,b")
        try:
            with client_for(auth) as c:
                return compare_view(c.compare(job_ids))
        except ApiError as exc:
            return error_box(exc)


def register_pages() -> None:
    """Add this module's page to dash.page_registry (once per process, after the first app exists)."""
    dash.register_page(__name__, path="/compare", name="Compare", title="fleetprof · compare", layout=layout)
