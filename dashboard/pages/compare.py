"""Compare runs (`/compare?ids=a,b`): the runs side by side against the first, and for each run the recommendations
it applied (`fleetprof run --apply`) with the predicted saving next to the realized one, each with its unit and
where it came from. Opened from a job page's "compare with" links or the jobs list's selection; the ids box takes
more (a job page's plain "compare" link fills in its own id).

One model across configurations (`/compare?fingerprint=F`, or below the runs of `ids`): the configurations (GPU
type and count, batch size, precision, framework) with their figures, bars of throughput, energy per sample and
step time per configuration, and the findings between configurations that differ in one axis
(GET /api/v1/jobs/characterization)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any
from urllib.parse import quote

import dash
from dash import Input, Output, State, dcc, html

from dashboard import figures
from dashboard import format as fmt
from dashboard.client import ApiError
from dashboard.components import client_for, error_box, job_link, section, table
from dashboard.session import AuthStore
from fleetprof.api_models import AppliedRecommendation, CharacterizationOut, CompareOut, RealizedSaving

PLACEHOLDER = "job ids, comma-separated: the first is the baseline"


def compare_href(job_ids: Sequence[str]) -> str:
    """The compare page of `job_ids` (each id quoted whole: '+' or '/' in an id stays itself)."""
    return "/compare?ids=" + ",".join(quote(i, safe="") for i in job_ids)


def split_ids(ids: str | None) -> list[str]:
    return [i.strip() for i in (ids or "").split(",") if i.strip()]


def characterization_href(fingerprint: str) -> str:
    """The compare page of one model across configurations (`fingerprint`: 20 hex characters)."""
    return "/compare?fingerprint=" + quote(fingerprint, safe="")


def layout(ids: str | None = None, fingerprint: str | None = None, **_: Any) -> html.Div:
    return html.Div([
        html.H2("Compare runs"),
        html.Div([dcc.Input(id="compare-ids-input", type="text", value=ids or "", placeholder=PLACEHOLDER,
                            className="text-input", size="60"),
                  dcc.Input(id="compare-fingerprint-input", type="text", value=fingerprint or "",
                            placeholder="or a model's fingerprint", className="text-input", size="24"),
                  html.Button("Compare", id="compare-submit", n_clicks=0)], className="filters"),
        dcc.Loading(html.Div(id="compare-view"), type="dot"),
    ])


def _predicted(saving: dict[str, Any] | None) -> str:
    """The recommendation's `saving`, each figure by the unit its key names; unknown when it gave none."""
    if not saving:
        return fmt.UNKNOWN
    # amounts before shares (stored metadata comes back with its keys in the database's order, not the writer's)
    keys = sorted(saving, key=lambda k: (k.endswith(("_pct", "_fraction")), k))
    return ", ".join(f"{k}: {fmt.by_key(k, saving[k])}" for k in keys
                     if saving[k] is None or isinstance(saving[k], (int, float))) or fmt.UNKNOWN


def _predicted_source(item: AppliedRecommendation) -> str:
    where = f"{item.from_job}'s report" if item.from_job else "the report it came from (job not recorded)"
    return f"{where}: its {item.kind} recommendation, recorded when the run started (fleetprof run --apply)"


def _amount(unit: str, value: float | None) -> str:
    """A realized figure by the unit the API names (`bytes`, `s`, `J`)."""
    if value is None:
        return fmt.UNKNOWN
    by_unit = {"bytes": fmt.size, "B": fmt.size, "s": fmt.seconds, "J": fmt.energy, "W": fmt.watts, "%": fmt.pct}
    return by_unit[unit](value) if unit in by_unit else f"{value:,.4g} {unit}"


def _realized_one(r: RealizedSaving) -> str:
    if r.saving is None:
        missing = [side for side, v in (("this run", r.after), (r.against_job_id, r.before)) if v is None]
        return (f"{r.figure}: unknown ({' and '.join(missing) or 'a run'} did not measure it; "
                f"{r.against_job_id} {_amount(r.unit, r.before)}, this run {_amount(r.unit, r.after)})")
    pct = f" ({r.saving_pct:.1f} %)" if r.saving_pct is not None else ""
    verb = "less" if r.saving >= 0 else "more"
    return (f"{r.figure}: {_amount(r.unit, abs(r.saving))} {verb} than {r.against_job_id}{pct} "
            f"({_amount(r.unit, r.before)} → {_amount(r.unit, r.after)})")


def _realized(item: AppliedRecommendation) -> str:
    if not item.realized:
        return f"{fmt.UNKNOWN} (no other run to measure against)"
    return "; ".join(_realized_one(r) for r in item.realized)


def _realized_source(item: AppliedRecommendation) -> str:
    return "; ".join(f"{r.source}, this run against {r.against_job_id}" for r in item.realized) or fmt.UNKNOWN


def compare_view(out: CompareOut) -> list[html.Section]:
    """The comparison as sections: runs, applied recommendations, findings (pure: data in, components out)."""
    runs = [[job_link(r.job_id), fmt.text(r.gpu_name), fmt.count(r.gpu_count, "GPUs"), fmt.count(r.batch_size),
             fmt.text(r.precision), fmt.seconds(r.step_time_p50_s), fmt.size(r.peak_reserved_bytes),
             fmt.by_key("energy_per_step_j", r.energy_per_step_j)]
            for r in out.jobs]
    applied = [[job_link(r.job_id), a.kind, fmt.text(a.setting),
                job_link(a.from_job) if a.from_job else fmt.UNKNOWN,
                html.Span(_predicted(a.predicted_saving), className="compare-predicted"),
                html.Span(_predicted_source(a), className="muted"),
                html.Span(_realized(a), className="compare-realized"),
                html.Span(_realized_source(a), className="muted")]
               for r in out.jobs for a in r.applied]
    return [
        section("Runs", table(["job", "GPU", "count", "batch", "precision", "step time p50", "peak reserved",
                               "energy per step"], runs, id="compare-runs")),
        section("Applied recommendations: predicted and realized saving",
                table(["run", "kind", "setting", "from job", "predicted saving", "predicted by", "realized saving",
                       "measured from"], applied, id="compare-applied",
                      empty="no run applied a recommendation (fleetprof run --apply)")),
        section("Findings", html.Ul([html.Li(f) for f in out.findings], id="compare-findings")),
    ]


def _cost(value: float | None) -> str:
    """Dollars per step: often fractions of a cent, so three significant digits."""
    return fmt.UNKNOWN if value is None else f"${value:.3g}"


CONFIGURATION_COLUMNS = ["GPU", "count", "batch", "precision", "framework", "runs", "step time p50", "samples/s",
                         "peak memory", "headroom", "energy per step", "energy per sample", "cost per step",
                         "energy cost per step", "GPU util", "MFU"]


def characterization_view(out: CharacterizationOut) -> list[html.Section]:
    """One model across configurations: what it is, the configurations' table, bars per configuration, findings
    (pure: data in, components out). Figures are medians over each configuration's runs; unknown reads unknown."""
    confs = out.configurations
    rows = [[fmt.text(c.gpu_type), fmt.count(c.gpu_count), fmt.count(c.batch_size), fmt.text(c.precision),
             fmt.text(c.framework), html.Span([job_link(j) for j in c.job_ids[:5]] + (
                 [html.Span(f" +{len(c.job_ids) - 5}")] if len(c.job_ids) > 5 else []), className="compare-runs"),
             fmt.seconds(c.step_time_s), fmt.by_key("samples_per_s", c.samples_per_s), fmt.size(c.peak_memory_bytes),
             fmt.size(c.headroom_bytes), fmt.energy(c.energy_per_step_j),
             fmt.UNKNOWN if c.energy_per_sample_j is None else f"{fmt.energy(c.energy_per_sample_j)}/sample",
             _cost(c.cost_per_step_usd), _cost(c.energy_cost_per_step_usd), fmt.pct(c.gpu_util_mean_pct),
             fmt.fraction_pct(c.mfu_fraction)]
            for c in confs]
    head = [f"fingerprint {out.fingerprint or 'mixed or unknown'}", f"model {fmt.text(out.model_class)}",
            f"{fmt.count(out.parameter_count)} parameters", f"{out.runs_total} run(s)",
            "varies: " + (", ".join(out.axes_varied) or "nothing (one configuration)")]
    plots = [("samples_per_s", "Throughput per configuration (samples/s)", "samples/s", 1.0),
             ("energy_per_sample_j", "Energy per sample per configuration (J/sample)", "J/sample", 1.0),
             ("step_time_s", "Step time p50 per configuration (s)", "s", 1.0)]
    return [
        section("One model across configurations", html.P(" · ".join(head), id="characterization-head"),
                table(CONFIGURATION_COLUMNS, rows, id="characterization-configurations",
                      empty="no runs of this model visible to this token"), id="characterization"),
        section("Per configuration", *[dcc.Graph(figure=figures.configuration_bars(
            confs, figure=key, title=title, y_title=unit, scale=scale), id=f"characterization-{key}",
            config={"displaylogo": False}) for key, title, unit, scale in plots]),
        section("What changing one axis did",
                html.Ul([html.Li(f.summary) for f in out.findings], id="characterization-findings")
                if out.findings else html.Div("no two configurations differ in exactly one axis (GPU type, count, "
                                              "batch size, precision, framework)", className="empty",
                                              id="characterization-findings"),
                *([html.Ul([html.Li(n, className="muted") for n in out.notes])] if out.notes else [])),
    ]


def register_callbacks(app: dash.Dash) -> None:
    @app.callback(Output("compare-view", "children"), Input("compare-submit", "n_clicks"),
                  Input("compare-ids-input", "n_submit"), Input("compare-fingerprint-input", "n_submit"),
                  Input("auth", "data"), State("compare-ids-input", "value"),
                  State("compare-fingerprint-input", "value"))
    def _compare(_clicks: int, _submits: int | None, _fp_submits: int | None, auth: AuthStore | None,
                 ids: str | None, fingerprint: str | None):
        job_ids = split_ids(ids)
        fingerprint = (fingerprint or "").strip() or None
        if fingerprint is not None and not job_ids:
            try:
                with client_for(auth) as c:
                    return characterization_view(c.characterization(fingerprint=fingerprint))
            except ApiError as exc:
                return error_box(exc, id="compare-error")
        if not job_ids:
            return error_box("name two or more runs: /compare?ids=a,b, or a model: /compare?fingerprint=F",
                             id="compare-error")
        if len(job_ids) < 2:
            return error_box(f"add the id of another run to compare with {job_ids[0]} (comma-separated)",
                             id="compare-error")
        try:
            with client_for(auth) as c:
                return [*compare_view(c.compare(job_ids)), *characterization_view(
                    c.characterization(job_ids=job_ids))]
        except ApiError as exc:
            return error_box(exc, id="compare-error")


def register_pages() -> None:
    """Add this module's page to dash.page_registry (once per process, after the first app exists)."""
    dash.register_page(__name__, path="/compare", name="Compare", title="fleetprof · compare", layout=layout)
