"""Job report page: memory, power and utilization timelines, step times, layers, energy, recommendations,
optimization plans, and the HTML report to download.

Server callbacks, started together when the page opens, each fetching its API data in parallel:
- `_report`: the job and its stored report -> KPIs, energy, recommendations, plans, layers, GPUs, sources;
- `_timelines`: memory, power and utilization series (one call: the API reads each GPU's samples once) and the
  framework steps, downsampled by the API to the plots' width -> the three time plots and the step-time
  histogram;
- `_captures`: the job and its live captures (issue #19), with the report's breakdowns of analyzed ones -> the
  Captures list and whether the Capture control is enabled (a running job only). `_request_capture` POSTs a
  capture with the signed-in token and re-runs `_captures`;
- `_other_gpus`: the job's right-sizing -> its projections onto the catalogue's other GPU types, with what set
  their ratios (the page stands without them).
A zoom on any time plot (or its reset) re-runs `_timelines` for the range, so the plots show it at full
resolution and share one time axis. The browser decides what counts as a zoom (`job-view`, a clientside
callback): the plots' own autosize events never reach the server.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence
from typing import Any, cast
from urllib.parse import unquote

import dash
from dash import Input, Output, State, dcc, html
from dash.exceptions import PreventUpdate

from dashboard import data, figures
from dashboard import format as fmt
from dashboard.client import ApiError, gather
from dashboard.components import by_suffix, client_for, error_box, kpi, section, table
from dashboard.downloads import report_href, trace_href
from dashboard.pages.compare import characterization_href, compare_href
from dashboard.session import AuthStore
from fleetprof import units
from fleetprof.api_models import Band, CandidateGpu, Capture, JobRead
from fleetprof.jobid import job_id_problem
from fleetprof.report import CaptureEntry, JobReport, ProcessMemory, TimeBreakdown

_GRAPH_CONFIG: dcc.Graph.Config = {"displaylogo": False}
CONTENT_MAX_PX = 1500  # .content max-width in assets/style.css
_PAGE_PADDING_PX, _ROW_GAP_PX, _PLOT_MARGINS_PX = 48, 12, 80


def layout(job_id: str | None = None, **_: Any) -> html.Div:
    job_id = unquote(job_id or "")
    problem = job_id_problem(job_id)
    if problem is not None:  # the API would answer 404; say what is wrong with the address instead
        return html.Div([html.H2("Job"), error_box(f"{job_id!r} is not a job id: {problem}", id="job-error")])

    def half(graph_id: str) -> html.Div:
        return html.Div(dcc.Graph(id=graph_id, config=_GRAPH_CONFIG), className="half")

    return html.Div([
        dcc.Store(id="job-id", data=job_id),
        dcc.Store(id="job-view"),
        html.Div([html.H2(["Job ", html.Span(job_id, id="job-title")]),
                  html.Button("Download HTML report", id="job-download-button", n_clicks=0),
                  dcc.Download(id="job-download")], className="page-head"),
        html.Div(id="job-compare", className="compare-links"),
        dcc.Loading(html.Div(id="job-summary"), type="dot"),
        captures_card(),
        html.P("Drag on a time plot to zoom: all three are fetched again at full resolution for the range. "
               "Double-click to reset.", className="muted"),
        dcc.Graph(id="job-memory", config=_GRAPH_CONFIG),
        html.Div([half("job-power"), half("job-util")], className="row"),
        html.Div([half("job-step-hist"), half("job-layer-bars")], className="row"),
        html.Div(id="job-details"),
        html.Div(id="job-other-gpus"),
    ])


# What set a projection's ratios (CandidateGpu.calibration_source), in words.
RATIOS_FROM: dict[str | None, str] = {
    "fingerprint_runs": "this model's runs on both types",
    "fleet_pairs": "datasheets x other models' runs on both types",
    None: "datasheets and this run's telemetry",
}


def _ratio(band: Band | None) -> str:
    return "unknown" if band is None else f"x{band.central:.2f} [{band.low:.2f}-{band.high:.2f}]"


def other_gpus_section(candidates: Sequence[CandidateGpu], unavailable: str | None) -> html.Section:
    """The job on the catalogue's other GPU types (right-sizing's projections): each ratio to what it measured, with
    its band, and what set the ratios."""
    rows = [[c.gpu, _ratio(c.step_time_ratio), _ratio(c.cost_per_step_ratio), _ratio(c.energy_per_step_ratio),
             "unknown" if c.fits is None else ("yes" if c.fits else "no"), RATIOS_FROM[c.calibration_source]]
            for c in candidates]
    note = ("Projected from this run (GET /api/v1/jobs/{id}/projection?gpu= has the whole projection); ratios to "
            "what it measured, x central [band]; cheapest per step first.")
    return section("On other GPU types (projection)", html.P(note, className="muted"),
                   table(["GPU type", "step time", "cost per step", "energy per step", "fits in memory",
                          "ratios from"], rows, id="job-other-gpus-table",
                         empty=f"no projection: {unavailable}" if unavailable else "no other GPU type"),
                   id="job-other-gpus-card")


def plot_points(width_px: int | None, *, half: bool) -> int:
    """Points per GPU to ask the API for, from the browser window's width and the page layout: one bucket (its
    min and max) per two pixels of the plot area. Finer is not visibly different, and the plots take twice as
    long to draw (bench/dashboard.py)."""
    content = min(width_px or 1400, CONTENT_MAX_PX) - _PAGE_PADDING_PX
    plot = (content - _ROW_GAP_PX) / 2 if half else content
    return int(min(max(plot - _PLOT_MARGINS_PX, 100), 2500))


# ------------------------------------------------------------------------------------------------ pieces

SAME_NAME_LIMIT = 100  # runs of a recurring job's name read to find its previous run


def _applied(job: JobRead) -> list[dict[str, Any]]:
    """The job's metadata `applied` entries (`fleetprof run --apply`) that name the job they came from."""
    entries = job.metadata.get("applied")
    return [a for a in entries if isinstance(a, dict) and isinstance(a.get("from_job"), str)] \
        if isinstance(entries, list) else []


def _started(job: JobRead) -> float:
    return job.started_at if job.started_at is not None else job.created_at


def compare_links(job: JobRead, same_name: list[JobRead]) -> html.Div:
    """Links to the compare page: with the run(s) this job applied recommendations from, with the previous run of
    its (recurring) name, with later runs of that name that applied this job's recommendations; and a compare page
    with only this job filled in, to name another. `same_name`: runs the API listed for the name (any order)."""
    links: list[tuple[list[str], str]] = []  # (ids, why)
    for a in _applied(job):
        links.append(([a["from_job"], job.job_id], f"the run it applied {a.get('kind', 'a recommendation')} from"))
    others = [j for j in same_name if job.name and j.name == job.name and j.job_id != job.job_id]
    earlier = [j for j in others if _started(j) < _started(job)]
    if earlier:
        prev = max(earlier, key=_started)
        links.append(([prev.job_id, job.job_id], f"the previous run of {job.name}"))
    for j in sorted(others, key=_started):
        kinds = [a.get("kind", "a recommendation") for a in _applied(j) if a["from_job"] == job.job_id]
        if kinds:
            links.append(([job.job_id, j.job_id], f"a later run that applied this run's {', '.join(kinds)}"))
    seen: set[str] = set()
    items: list[Any] = []
    for ids, why in links:
        other = ids[0] if ids[1] == job.job_id else ids[1]
        if other in seen:
            continue
        seen.add(other)
        items.append(html.Li([dcc.Link(f"compare with {other}", href=compare_href(ids)),
                              html.Span(f" ({why})", className="muted")]))
    items.append(html.Li(dcc.Link("compare with another run", href=compare_href([job.job_id]))))
    return html.Div([html.Span("Compare: ", className="muted"), html.Ul(items, className="inline-list")])



def summary_section(job: JobRead, report: JobReport | None) -> list[Any]:
    """Job metadata, warnings (OOM, replayed telemetry, ended by the server) and the headline KPIs (with a report)."""
    meta = table(["name", "team", "state", "node", "GPUs", "started", "ended", "duration", "analyzed"], [[
        fmt.text(job.name), fmt.text(job.team), job.state, fmt.text(job.node), fmt.count(len(job.gpu_uuids)),
        fmt.timestamp(job.started_at), fmt.timestamp(job.ended_at), fmt.seconds(job.duration_s),
        fmt.timestamp(report.analyzed_at if report else None),
    ]], id="job-meta")
    warnings = []
    if report and (report.memory.oom_detected or report.memory.oom_suspected):
        what = "Out of memory" if report.memory.oom_detected else "Out of memory suspected"
        warnings.append(html.Div([html.B(what + ": "), "; ".join(report.memory.oom_evidence)], className="error",
                                 id="job-oom"))
    if job.metadata.get("replay"):
        warnings.append(html.Div("This job's telemetry is a replay of a recording, not live NVML.",
                                 className="notice"))
    if job.end_reason:  # state "lost": the server ended it, nobody reported how it ended
        warnings.append(html.Div([html.B("Ended by the server: "), job.end_reason], className="notice",
                                 id="job-end-reason"))
    return [*warnings, meta, *([kpis(report)] if report else [])]


def kpis(report: JobReport) -> html.Div:
    mem, tm, ut, src = report.memory, report.time, report.utilization, report.sources
    gpm = ut.gpm
    return html.Div([
        kpi("Peak memory used", fmt.gib(mem.peak_used_bytes), fmt.source(src.memory_peak_used_bytes),
            id="job-peak-used"),
        kpi("Peak allocated", fmt.gib(mem.peak_allocated_bytes), fmt.source(src.memory_peak_allocated_bytes),
            id="job-peak-allocated"),
        kpi("Peak reserved", fmt.gib(mem.peak_reserved_bytes), fmt.source(src.memory_peak_reserved_bytes),
            id="job-peak-reserved"),
        kpi("Headroom at peak", fmt.gib(mem.headroom_bytes), "GPU capacity − NVML peak used", id="job-headroom"),
        kpi("Fragmentation", fmt.gib(mem.fragmentation_bytes), fmt.source(src.memory_fragmentation_bytes),
            id="job-fragmentation"),
        kpi("GPU utilization (mean / p95)", f"{fmt.pct(ut.gpu_mean_pct)} / {fmt.pct(ut.gpu_p95_pct)}",
            fmt.source(src.utilization_gpu_mean_pct), id="job-util-mean"),
        kpi("GPU busy", fmt.fraction_pct(tm.gpu_busy_fraction), fmt.source(src.time_gpu_busy_fraction),
            id="job-busy"),
        kpi("Steps", fmt.count(tm.steps, "steps"), fmt.source(src.time_steps), id="job-steps"),
        kpi("Step time p50 / p95", f"{fmt.seconds(tm.step_time_s.p50)} / {fmt.seconds(tm.step_time_s.p95)}",
            fmt.source(src.time_steps), id="job-step-time"),
        kpi("Throughput", fmt.count(tm.samples_per_s, "samples/s"),
            fmt.source(src.time_steps) if tm.samples_per_s is not None else None, id="job-throughput"),
        kpi("Iteration period", fmt.seconds(tm.period_s), fmt.source(src.time_period_s), id="job-period"),
        kpi("MFU", fmt.fraction_pct(report.mfu.mfu_fraction if report.mfu else None),
            fmt.source(src.mfu_mfu_fraction), id="job-mfu"),
        kpi("SM activity (mean)", fmt.pct(gpm.sm_activity_mean_pct if gpm else None), gpm.source if gpm else None,
            id="job-gpm-sm"),
        kpi("Tensor activity (mean)", fmt.pct(gpm.tensor_activity_mean_pct if gpm else None),
            gpm.source if gpm else None, id="job-gpm-tensor"),
    ], className="kpis")


def health_section(report: JobReport) -> html.Section:
    """Health findings per GPU (throttling, clocks, temperature, XID, error counters) and the stragglers found
    from NVML alone; "unknown" from a collector that predates them."""
    health = report.health
    if health is None:
        body: Any = html.Div(fmt.UNKNOWN + " (the report has no health section)", className="empty")
    else:
        # a counted event (an error counter's rise) has a count and no duration: "-" there is known, not unknown
        rows = [[f.gpu_uuid or fmt.UNKNOWN, f.kind, f.severity or "info",
                 "-" if f.seconds is None and f.count is not None else fmt.seconds(f.seconds),
                 "-" if f.fraction is None and f.count is not None else fmt.fraction_pct(f.fraction),
                 "-" if f.count is None else str(f.count), fmt.timestamp(f.since_ts), f.summary, fmt.text(f.source)]
                for f in health.findings]
        body = table(["GPU", "kind", "severity", "for", "share", "count", "since", "what", "source"], rows,
                     id="job-health", empty=f"no findings on {fmt.count(health.gpus_checked, 'GPUs')}")
    st = report.time.stragglers
    by_gpu = [s for s in (st.stragglers if st else []) if s.gpu_uuid]
    stragglers = table(["GPU", "slower by", "busy phase / iteration", "peers'", "from", "to", "likely cause"],
                       [[s.gpu_uuid or "", fmt.fraction_pct(s.slowdown_fraction), fmt.seconds(s.busy_phase_s),
                         fmt.seconds(s.peer_busy_phase_s), fmt.timestamp(s.since_ts), fmt.timestamp(s.until_ts),
                         fmt.text(s.likely_cause)] for s in by_gpu],
                       id="job-gpu-stragglers", empty="no straggling GPU found from NVML")
    return section("GPU health (NVML)", body, html.H4("Stragglers from NVML"), stragglers, id="job-health-card")


def gpm_section(report: JobReport) -> html.Section:
    """NVML GPM per GPU (Hopper+): how much of the GPU the job used, where utilization only says a kernel ran;
    "unknown" for a GPU without GPM (and for reports analyzed before GPM was)."""
    gpm = report.utilization.gpm
    if gpm is None:
        return section("GPU efficiency (NVML GPM)", html.P("unknown: this report was analyzed before GPM was",
                                                           className="muted", id="job-gpm-none"), id="job-gpm-card")
    rows = [[g.gpu_uuid, fmt.pct(g.sm_activity_mean_pct), fmt.pct(g.sm_occupancy_mean_pct),
             fmt.pct(g.tensor_activity_mean_pct), fmt.pct(g.dram_bw_util_mean_pct),
             f"{fmt.bytes_per_s(g.pcie_tx_mean_bytes_per_s)} / {fmt.bytes_per_s(g.pcie_rx_mean_bytes_per_s)}",
             f"{fmt.bytes_per_s(g.nvlink_tx_mean_bytes_per_s)} / {fmt.bytes_per_s(g.nvlink_rx_mean_bytes_per_s)}",
             fmt.count(g.samples), g.source or "unknown (no GPM on this GPU)"] for g in gpm.gpus]
    note = (f"means over the job's samples; source: {gpm.source}" if gpm.source else
            "unknown: none of the job's GPUs reports GPM (NVML GPM needs Hopper or later)")
    return section("GPU efficiency (NVML GPM)", html.P(note, className="muted", id="job-gpm-source"),
                   table(["GPU", "SM activity", "SM occupancy", "tensor activity", "DRAM bandwidth",
                          "PCIe tx / rx", "NVLink tx / rx", "samples", "source"], rows, id="job-gpm"),
                   id="job-gpm-card")


def energy_card(report: JobReport) -> html.Section:
    e = report.energy
    source = fmt.energy_source(e.source)
    if e.source == "mixed":
        source += " (some GPUs or intervals had no usable counter)"
    if e.counter_resets:
        source += f"; {e.counter_resets:,} counter resets bridged with integrated power"

    def kwh(value: float | None, extra: str = "") -> str:
        return fmt.UNKNOWN if value is None else f"{value:,.4f} kWh{extra}"

    rows = [
        ["energy (all GPUs)", fmt.energy(e.energy_j)],
        ["GPU energy", kwh(e.kwh)],
        ["facility energy (× PUE)", kwh(e.facility_kwh, f" (PUE {e.pue})" if e.pue else "")],
        ["mean power (all GPUs)", fmt.watts(e.mean_power_w)],
        ["energy per step", fmt.energy(e.energy_per_step_j)],
        ["energy per sample", fmt.energy(e.per_sample_j)],
        ["idle energy", f"{fmt.energy(e.idle_energy_j)} ({fmt.fraction_pct(e.idle_energy_fraction)})"],
        ["CO2e", f"{fmt.grams(e.co2e_g)} at {fmt.count(e.grid_intensity_g_per_kwh, 'g/kWh')}"],
        ["cost", f"{fmt.usd(e.cost_usd)} at {fmt.usd(e.price_per_kwh_usd)}/kWh"],
    ]
    return section("Energy", html.P(["source: ", html.B(source, id="job-energy-source")]),
                   table(["", "value"], rows, id="job-energy"), id="job-energy-card")


def recommendations_section(report: JobReport) -> html.Section:
    items = []
    for r in report.recommendations:
        line = saving_line(r.saving)
        items.append(html.Li([html.B(fmt.text(r.summary)), html.Span(f" ({r.kind})", className="muted"),
                              html.Div(["why: ", fmt.text(r.reason)]),
                              html.Div(line) if line else None]))
    body = html.Ul(items, id="job-recommendations") if items else html.Div("no recommendations", className="empty")
    return section("Recommendations", body)


def saving_line(saving: Mapping[str, Any] | None) -> str | None:
    """A recommendation's saving, each figure by its unit; when every figure is negative (a larger GPU to stop
    OOMs costs more), said as the extra cost it is rather than as a negative saving."""
    if saving is None:
        return None
    numbers = {k: v for k, v in saving.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
    if numbers and all(v < 0 for v in numbers.values()):
        return "extra cost: " + ", ".join(by_suffix(k, -numbers[k] if k in numbers else v) for k, v in saving.items())
    return "saving: " + ", ".join(by_suffix(k, v) for k, v in saving.items())


def _plan_table(plan: Mapping[str, Any], keys: tuple[str, ...]) -> html.Table | html.Div:
    return table(["", "value"], [[k.replace("_", " "), by_suffix(k, plan.get(k))] for k in keys if k in plan])


def optimization_section(report: JobReport) -> html.Section | None:
    """Offset plan (planned peak vs observed reserved vs the lower bound), swap plan, fragmentation findings,
    from the job's allocation trace; any other part of the plan as a table of its fields. The plans are the
    trace analyzers' documents (OPEN in the report): read by key."""
    opt = report.optimization
    if not opt:
        return None
    parts: list[Any] = [html.P(["from ", html.B(fmt.text(report.sources.optimization or opt.get("source")))],
                               className="muted")]
    offset, swap = opt.get("offset_plan"), opt.get("swap_plan")
    if opt.get("memory_breakdown"):
        parts.append(dcc.Graph(id="job-memory-breakdown", config=_GRAPH_CONFIG, figure=figures.memory_breakdown_bar(
            [("measured (allocation trace)", opt["memory_breakdown"])])))
    if offset or swap:
        parts.append(dcc.Graph(figure=figures.memory_plan_bars(offset, swap), config=_GRAPH_CONFIG,
                               id="job-plan-bars"))
    if isinstance(offset, dict):
        parts += [html.H4("Offset plan (2D rectangle packing of the traced allocations)"),
                  html.P(offset_plan_sentence(offset), id="job-offset-plan"),
                  _plan_table(offset, ("allocations", "algorithm", "lower_bound_bytes", "planned_bytes",
                                       "observed_reserved_bytes", "potential_saving_bytes",
                                       "overhead_vs_lower_bound_fraction", "untracked_live_bytes", "device"))]
    if isinstance(swap, dict):
        parts += [html.H4("Swap / offload plan"), html.P(swap_plan_sentence(swap), id="job-swap-plan"),
                  _plan_table(swap, ("tensors_swapped", "saved_bytes", "old_peak_bytes", "new_peak_bytes",
                                     "pinned_host_bytes", "pcie_bandwidth_bytes_per_s", "pcie_bandwidth_source",
                                     "projected_slowdown_fraction", "forced_stall_per_step_s", "candidate_rule",
                                     "approximation"))]
        tensors = swap.get("tensors") or []
        if tensors:
            cols = ("allocation", "size_bytes", "offload_start_s", "offload_end_s", "prefetch_start_s",
                    "prefetch_end_s", "idle_window_s")
            parts += [html.H5(f"largest swapped tensors ({len(tensors):,}; times from the "
                              f"{fmt.text(swap.get('times_relative_to'))})"),
                      table([c.replace("_", " ") for c in cols],
                            [[by_suffix(c, t.get(c)) if c != "allocation" else fmt.text(t.get(c)) for c in cols]
                             for t in tensors[:15]])]
    findings = opt.get("fragmentation")
    if isinstance(findings, list) and findings:
        parts += [html.H4("Fragmentation findings"),
                  table(["finding", "why", "waste", "saving"],
                        [[fmt.text(f.get("summary")), fmt.text(f.get("reason")),
                          by_suffix("waste_bytes", f.get("waste_bytes")),
                          by_suffix("saving_bytes", f.get("saving_bytes"))]
                         for f in findings], id="job-fragmentation-findings")]
    for name, plan in opt.items():  # parts this page does not know yet: their fields, units from the names
        if name in ("offset_plan", "swap_plan", "fragmentation", "source", "notes") or not plan:
            continue
        if isinstance(plan, dict):
            parts += [html.H4(name.replace("_", " ")),
                      table(["", "value"], [[k.replace("_", " "), by_suffix(k, v)] for k, v in plan.items()
                                            if not isinstance(v, (dict, list))])]
        elif not isinstance(plan, list):
            parts += [html.H4(name.replace("_", " ")), html.Div(by_suffix(name, plan))]
    for note in opt.get("notes") or []:
        parts.append(html.P(fmt.text(note), className="muted"))
    return section("Optimization plans", *parts, id="job-optimization")


def offset_plan_sentence(plan: Mapping[str, Any]) -> str:
    planned, bound, observed = plan.get("planned_bytes"), plan.get("lower_bound_bytes"), \
        plan.get("observed_reserved_bytes")
    text = f"Placing every traced allocation at a planned offset needs {fmt.gib(planned)}"
    if plan.get("overhead_vs_lower_bound_fraction") is not None:
        text += f", {fmt.fraction_pct(plan['overhead_vs_lower_bound_fraction'])} above the lower bound"
    text += f" of {fmt.gib(bound)} (the most bytes ever live at once)"
    if observed is not None:
        text += f"; the caching allocator reserved {fmt.gib(observed)}"
        if plan.get("potential_saving_bytes") is not None:
            text += f": up to {fmt.gib(plan['potential_saving_bytes'])} less"
    return text + "."


def swap_plan_sentence(plan: Mapping[str, Any]) -> str:
    text = (f"Offloading {fmt.count(plan.get('tensors_swapped'), 'tensors')} to host memory during their idle "
            f"windows lowers the peak from {fmt.gib(plan.get('old_peak_bytes'))} to "
            f"{fmt.gib(plan.get('new_peak_bytes'))} ({fmt.gib(plan.get('saved_bytes'))} saved)")
    if plan.get("pcie_bandwidth_bytes_per_s"):
        text += (f" over PCIe at {plan['pcie_bandwidth_bytes_per_s'] / 1e9:,.1f} GB/s "
                 f"({fmt.text(plan.get('pcie_bandwidth_source'))})")
    if plan.get("projected_slowdown_fraction") is not None:
        text += f", projected slowdown {fmt.fraction_pct(plan['projected_slowdown_fraction'], 2)}"
    return text + "."


def layers_section(report: JobReport) -> html.Section:
    rows = [[fmt.text(r.module), fmt.text(r.module_type), fmt.seconds(r.forward_s), fmt.seconds(r.backward_s),
             fmt.seconds(r.total_s), fmt.fraction_pct(r.time_fraction), fmt.fraction_pct(r.self_time_fraction),
             fmt.size(r.activation_bytes), fmt.count(r.calls)] for r in report.time.layers]
    # Shares are of the step: inclusive (children included, the model itself ~100 %) and self (without them).
    return section("Layers (framework hooks, per sampled step)",
                   table(["module", "type", "forward", "backward", "total", "share of step", "self share",
                          "activations", "calls"],
                         rows, id="job-layers", empty="no per-layer data: the job ran without framework hooks"))


def framework_section(report: JobReport) -> html.Section | None:
    """What the hooks read inside the training process (batch size, model, optimizer, precision); None without hooks."""
    fw = report.framework
    if fw is None:
        return None
    batch = (f"{fmt.count(report.batch_size)} ({fmt.text(fw.batch_size_source)}; hooks read "
             f"{fmt.count(fw.batch_size_observed)} from {fmt.text(fw.batch_size_observed_source)})")
    precision = f"{fmt.text(fw.precision)} ({fmt.text(fw.precision_source)})"
    device = f"{fmt.text(fw.device)}: {fmt.gib(fw.device_memory_total_bytes)} ({fmt.text(fw.device_memory_source)})"
    fp = report.fingerprint
    model: Any = fmt.UNKNOWN if fp is None or fp.fingerprint is None else html.Span([
        f"{fp.fingerprint} ({fmt.text(fp.framework)} {fmt.text(fp.framework_version)}, {fmt.text(fp.precision)}) ",
        dcc.Link("this model across configurations", href=characterization_href(fp.fingerprint))])
    rows = [[batch, fmt.text(fw.model_class), fmt.count(fw.parameter_count, "parameters"),
             ", ".join(fw.optimizers or []) or fmt.UNKNOWN, precision, device, model]]
    return section("Training process (framework hooks)",
                   table(["batch size (source)", "model", "parameters", "optimizers", "precision", "device memory",
                          "fingerprint"], rows, id="job-framework"))


def gpus_section(report: JobReport) -> html.Section:
    rows = [[g.uuid, fmt.text(g.name), fmt.gib(g.memory_total_bytes), fmt.gib(g.peak_used_bytes),
             fmt.gib(g.headroom_bytes), fmt.pct(g.gpu_util_mean_pct), fmt.watts(g.mean_power_w),
             fmt.watts(g.power_limit_w), f"{fmt.energy(g.energy_j)} ({fmt.energy_source(g.energy_source)})",
             fmt.count(g.samples)]
            for g in report.gpus]
    return section("GPUs (NVML)", table(["uuid", "model", "capacity", "peak used", "headroom", "mean util",
                                         "mean power", "power limit", "energy (source)", "samples"], rows,
                                        id="job-gpus"))


def processes_section(report: JobReport) -> html.Section:
    mem = report.memory

    def row(p: ProcessMemory) -> list[str]:
        return [fmt.count(p.pid), fmt.text(p.gpu_uuid), p.whose, fmt.text(p.attribution), fmt.gib(p.peak_used_bytes),
                fmt.timestamp(p.first_seen), fmt.timestamp(p.last_seen)]

    summary = (f"largest process of this job {fmt.gib(mem.process_peak_bytes)}; other processes on its GPUs: "
               f"{fmt.count(mem.other_processes)}, up to {fmt.gib(mem.other_processes_peak_bytes)} "
               f"on one GPU (sum of their peaks)")
    return section("Processes on the job's GPUs (NVML per-process memory)",
                   html.P(summary, className="muted"),
                   table(["pid", "GPU", "whose", "attributed by", "peak used", "first seen", "last seen"],
                         [row(p) for p in mem.processes], id="job-processes",
                         empty="no per-process rows: the agent did not list the GPUs' processes"))


def downloads_section(job_id: str, traces: list[dict[str, Any]]) -> html.Section:
    """Links to the report and each stored trace as files other tools open (dashboard/downloads.py)."""
    items = [html.Li([html.A("report (JSON)", href=report_href(job_id, "json"), id="job-download-report-json"),
                      " · ", html.A("report (HTML)", href=report_href(job_id, "html"))])]
    for t in traces:
        what = ("Kineto trace (Perfetto, TensorBoard)" if t.get("kind") == "kineto"
                else "memory snapshot (pytorch.org/memory_viz)")
        rank = f", rank {t['rank']}" if t.get("rank") is not None else ""
        items.append(html.Li([html.A(t.get("filename") or f"trace {t['trace_id']}",
                                     href=trace_href(job_id, int(t["trace_id"])), className="job-download-trace"),
                              f" — {what}{rank}, {units.size(t.get('size_bytes'))}"]))
    return section("Downloads", html.Ul(items, id="job-downloads"))


def sources_section(report: JobReport) -> html.Section:
    # the keys the report holds: a figure whose source was never set is not listed as unknown
    named = report.sources.model_dump(by_alias=True, exclude_unset=True)
    rows = [[k, fmt.source(v) if v is not None else "unknown (not measured)"] for k, v in sorted(named.items())]
    return section("Where each figure came from", table(["figure", "source"], rows))


# ------------------------------------------------------------------------------------------------ captures

CAPTURE_KINDS = ("kineto", "allocator")
CAPTURE_STEPS_DEFAULT, CAPTURE_STEPS_MAX = 5, 100  # the API takes 1..100 steps
CAPTURE_TRIGGERS = {"manual": "manual", "step_time_regression": "automatic: step-time regression",
                    "straggler": "automatic: straggler rank"}


def _epoch(when: Any) -> float | None:
    return None if when is None else when.timestamp()


def _ms(value_s: float | None) -> str:
    return fmt.UNKNOWN if value_s is None else f"{value_s * 1000:,.1f} ms"


def capture_control_state(job: JobRead) -> tuple[bool, str]:
    """(disabled, why) of the Capture button: only a running job's hooks can take a capture."""
    if job.state == "running":
        return False, "Captures the next steps of the running job (its hooks poll for requests)."
    return True, f"Capture is only for a running job: this one is {fmt.text(job.state)}."


def capture_breakdown(b: TimeBreakdown | None) -> str:
    """An analyzed kineto capture's time breakdown, each figure with its unit; unknown where not measured."""
    if b is None:
        return fmt.UNKNOWN
    span = fmt.UNKNOWN if b.span_us is None else fmt.seconds(b.span_us / 1e6)
    comm = fmt.UNKNOWN if b.communication_us is None else fmt.seconds(b.communication_us / 1e6)
    return (f"compute {fmt.pct(b.compute_pct)}, non-compute {fmt.pct(b.non_compute_pct)}, idle {fmt.pct(b.idle_pct)}"
            f"; span {span}, communication {comm}")


def capture_medians(capture: Capture, entry: CaptureEntry | None) -> str | None:
    """An automatic capture's baseline vs recent step median (ms, with their factor); None for a manual one."""
    if capture.trigger.kind == "manual":
        return None
    t, comp = capture.trigger, entry.comparison if entry else None
    base = t.baseline_median_step_s if t.baseline_median_step_s is not None else \
        (comp.baseline_median_step_s if comp else None)
    recent = t.recent_median_step_s if t.recent_median_step_s is not None else \
        (comp.recent_median_step_s if comp else None)
    factor = t.factor if t.factor is not None else (comp.factor if comp else None)
    text = f"baseline {_ms(base)} → recent {_ms(recent)}"
    return text + (f" (×{factor:,.2f})" if factor is not None else " (factor unknown)")


def captures_table(captures: list[Capture], entries: Mapping[str, CaptureEntry] | None = None) -> Any:
    """The job's captures, newest first: trigger (and its summary), state, kind, steps, times; an analyzed
    capture's breakdown (from the report's entry of the same id), an automatic one's step medians."""
    entries = entries or {}
    rows = []
    for c in captures:
        entry = entries.get(c.capture_id)
        trigger: list[Any] = [html.B(CAPTURE_TRIGGERS.get(c.trigger.kind, c.trigger.kind)),
                              html.Div(fmt.text(c.trigger.summary), className="muted")]
        medians = capture_medians(c, entry)
        if medians:
            trigger.append(html.Div(medians, className="capture-medians"))
        state: list[Any] = [html.Span(c.state, className=f"capture-state capture-{c.state}")]
        if c.reason:
            state.append(html.Div(c.reason, className="muted"))
        if c.state == "analyzed" and c.kind == "kineto":
            result: Any = capture_breakdown(entry.breakdown if entry else None)
        elif c.state == "analyzed":
            result = f"{len(c.trace_ids):,} trace(s) analyzed (allocation trace: see Optimization plans)"
        else:
            result = "not analyzed yet" if c.state != "failed" else "none (failed)"
        last = max((t for t in (c.delivered_at, c.capturing_at, c.uploaded_at, c.analyzed_at, c.failed_at)
                    if t is not None), default=None)
        rows.append([c.capture_id, trigger, state, c.kind, fmt.count(c.steps, "steps"),
                     "all" if c.ranks is None else ", ".join(str(r) for r in c.ranks),
                     fmt.timestamp(_epoch(c.requested_at)), fmt.timestamp(_epoch(last)),
                     fmt.text(c.requested_by), result])
    return table(["capture", "trigger", "state", "kind", "steps", "ranks", "requested", "last change",
                  "requested by", "breakdown"], rows, id="job-captures-list", empty="no captures of this job")


def captures_card() -> html.Section:
    """The Captures section: the request control (filled by `_captures`) and the list."""
    return section("Captures", html.Div([
        html.Label(["kind ", dcc.Dropdown(id="job-capture-kind", options=list(CAPTURE_KINDS), value="kineto",
                                          clearable=False, style={"width": "10em", "display": "inline-block"})]),
        html.Label([" steps ", dcc.Input(id="job-capture-steps", type="number", min=1, max=CAPTURE_STEPS_MAX,
                                         step=1, value=CAPTURE_STEPS_DEFAULT, style={"width": "5em"})]),
        html.Button("Capture", id="job-capture-button", n_clicks=0, disabled=True),
        html.Span(id="job-capture-note", className="muted"),
    ], className="capture-control"), html.Div(id="job-capture-result"), dcc.Store(id="job-capture-requested"),
        dcc.Loading(html.Div(id="job-captures"), type="dot"), id="job-captures-card")


# ------------------------------------------------------------------------------------------------ callbacks

# What counts as a change of view, decided in the browser: a zoom (an x range) or its reset on one of the time
# plots; anything else (the plots' own autosize, a y-only zoom) stays in the browser. The relayout itself is
# parsed on the server (figures.relayout_range).
_VIEW_JS = """
function(jobId, auth, memory, power, util, current) {
    const view = (relayout) => ({job_id: jobId, width_px: window.innerWidth, relayout: relayout});
    const ctx = dash_clientside.callback_context;
    const zooms = (ctx.triggered || []).filter(t => t.prop_id.endsWith('.relayoutData'));
    if (!zooms.length || zooms.length !== ctx.triggered.length || !current || current.job_id !== jobId) {
        return view(null);  // page opened, or signed in again
    }
    const byId = {'job-memory': memory, 'job-power': power, 'job-util': util};
    const r = byId[zooms[0].prop_id.split('.')[0]] || {};
    if (r['xaxis.autorange']) {
        return current.relayout ? view(null) : dash_clientside.no_update;
    }
    if ('xaxis.range[0]' in r || 'xaxis.range' in r) {
        const keep = {};
        for (const k of ['xaxis.range[0]', 'xaxis.range[1]', 'xaxis.range']) { if (k in r) keep[k] = r[k]; }
        return view(keep);
    }
    return dash_clientside.no_update;
}
"""


def register_callbacks(app: dash.Dash) -> None:
    @app.callback(Output("job-summary", "children"), Output("job-details", "children"),
                  Output("job-title", "children"), Output("job-layer-bars", "figure"),
                  Input("job-id", "data"), Input("auth", "data"))
    def _report(job_id: str, auth: AuthStore | None):
        try:
            with client_for(auth) as c:
                job_doc, report_doc, traces = gather(lambda: c.job(job_id), lambda: c.report_json(job_id),
                                                     lambda: c.traces(job_id))
            for answer in (job_doc, report_doc):
                if isinstance(answer, ApiError):
                    raise answer
            job, report = data.job_record(job_doc), data.job_report(report_doc)
        except ApiError as exc:
            return error_box(exc, id="job-error"), [], job_id, figures.empty_figure("not available")
        details = [html.Div([html.Div(energy_card(report), className="half"),
                             html.Div(recommendations_section(report), className="half")], className="row"),
                   health_section(report),
                   optimization_section(report), framework_section(report), layers_section(report),
                   gpus_section(report), gpm_section(report),
                   processes_section(report), sources_section(report),
                   downloads_section(job_id, [] if isinstance(traces, ApiError)  # the report links still help
                                     else cast(list[dict[str, Any]], traces))]
        title = [job_id, html.Span(f" · {job.name}", className="muted")] if job.name else job_id
        layers = figures.layer_time_bars(report.time.layers)
        return summary_section(job, report), [d for d in details if d is not None], title, layers

    @app.callback(Output("job-other-gpus", "children"), Input("job-id", "data"), Input("auth", "data"))
    def _other_gpus(job_id: str, auth: AuthStore | None):
        """Right-sizing's projections onto the other GPU types, apart: the page stands without them."""
        try:
            with client_for(auth) as c:
                candidates, unavailable = data.other_gpu_types(c.rightsizing(job_id))
        except ApiError as exc:
            return section("On other GPU types (projection)", error_box(exc, id="job-other-gpus-error"),
                           id="job-other-gpus-card")
        return other_gpus_section(candidates, unavailable)

    @app.callback(Output("job-compare", "children"), Input("job-id", "data"), Input("auth", "data"))
    def _compare_links(job_id: str, auth: AuthStore | None):
        """The compare links: the job (what it applied), then the runs of its name (previous, later applied)."""
        try:
            with client_for(auth) as c:
                job = data.job_record(c.job(job_id))
                same_name: list[JobRead] = []
                if job.name:
                    with contextlib.suppress(ApiError):  # the links that need no listing still help
                        same_name = data.job_list(c.jobs(q=job.name, team=job.team, limit=SAME_NAME_LIMIT)).items
        except ApiError:
            return []  # the report callback says what went wrong
        return compare_links(job, same_name)

    app.clientside_callback(_VIEW_JS, Output("job-view", "data"), Input("job-id", "data"), Input("auth", "data"),
                            Input("job-memory", "relayoutData"), Input("job-power", "relayoutData"),
                            Input("job-util", "relayoutData"), State("job-view", "data"))

    @app.callback(Output("job-memory", "figure"), Output("job-power", "figure"), Output("job-util", "figure"),
                  Output("job-step-hist", "figure"), Input("job-view", "data"), State("auth", "data"))
    def _timelines(view: dict[str, Any] | None, auth: AuthStore | None):
        """The time plots and step times for the view's range (the whole job when not zoomed)."""
        if not view or not view.get("job_id"):
            raise PreventUpdate
        job_id = view["job_id"]
        rng = figures.relayout_range(view.get("relayout"))
        since, until = rng if isinstance(rng, tuple) else (None, None)
        full, half = plot_points(view.get("width_px"), half=False), plot_points(view.get("width_px"), half=True)
        steps: dict[str, Any] | ApiError | None
        try:
            with client_for(auth) as c:
                series, steps = gather(
                    lambda: c.timeseries_batch(job_id, {"memory_used_bytes": full, "power_w": half,
                                                        "gpu_util_pct": half, "gpm_sm_activity_pct": half},
                                               since=since, until=until),
                    lambda: c.steps(job_id, since=since, until=until, points=full // 2))
        except ApiError as exc:
            series = steps = exc
        if isinstance(series, ApiError):
            used = power = util = series
            sm_activity = None
        else:
            used, power, util = series["memory_used_bytes"], series["power_w"], series["gpu_util_pct"]
            sm_activity = series.get("gpm_sm_activity_pct")
        if isinstance(steps, ApiError) and steps.status in (404, 405):
            steps = None  # an API without per-step series
        x_range = (since, until) if since is not None and until is not None else None

        def fig(answer: Any, build: Any, title: str) -> Any:
            return figures.empty_figure(str(answer), title=title) if isinstance(answer, ApiError) else build(answer)

        hist_title = "Step time"
        return (
            fig(used, lambda u: figures.memory_timeline(
                u, None if isinstance(steps, ApiError) else steps, x_range=x_range), "Device memory"),
            fig(power, lambda p: figures.metric_timeline(p, title="Power (W, NVML)", y_title="W", hover_unit="W",
                                                         x_range=x_range), "Power"),
            fig(util, lambda u: figures.metric_timeline(
                u, title="GPU utilization (%, NVML)", y_title="%", hover_unit="%", x_range=x_range,
                overlay=sm_activity, overlay_name="SM activity (NVML GPM)"), "GPU utilization"),
            fig(steps, lambda s: figures.step_time_histogram(s, zoomed=x_range is not None), hist_title),
        )

    @app.callback(Output("job-captures", "children"), Output("job-capture-button", "disabled"),
                  Output("job-capture-note", "children"), Input("job-id", "data"), Input("auth", "data"),
                  Input("job-capture-requested", "data"))
    def _captures(job_id: str, auth: AuthStore | None, _requested: Any):
        """The captures as the API lists them now (the report adds analyzed ones' breakdowns), and whether the
        job can be captured. Re-run after each request from this page."""
        try:
            with client_for(auth) as c:
                job_doc, listed = gather(lambda: c.job(job_id), lambda: c.captures(job_id))
                for answer in (job_doc, listed):
                    if isinstance(answer, ApiError):
                        raise answer
                job = data.job_record(job_doc)
                captures = cast(list[Capture], listed)  # gather's results share one type: the client's own
                entries: dict[str, CaptureEntry] = {}
                if any(x.state == "analyzed" or x.trigger.kind != "manual" for x in captures):
                    with contextlib.suppress(ApiError):  # the list itself still shows without the report
                        report = data.job_report(c.report_json(job_id))
                        if report.captures is not None:
                            entries = {e.capture_id: e for e in report.captures.captures}
        except ApiError as exc:
            return error_box(exc, id="job-captures-error"), True, "captures not available"
        disabled, why = capture_control_state(job)
        return captures_table(captures, entries), disabled, why

    @app.callback(Output("job-capture-result", "children"), Output("job-capture-requested", "data"),
                  Input("job-capture-button", "n_clicks"), State("job-capture-kind", "value"),
                  State("job-capture-steps", "value"), State("job-id", "data"), State("auth", "data"),
                  prevent_initial_call=True)
    def _request_capture(n: int, kind: str | None, steps: Any, job_id: str, auth: AuthStore | None):
        """POST the capture with the signed-in token; the new capture's state, or the API's refusal."""
        if not n:
            raise PreventUpdate
        if not isinstance(steps, int) or isinstance(steps, bool) or not 1 <= steps <= CAPTURE_STEPS_MAX:
            return error_box(f"steps: a whole number from 1 to {CAPTURE_STEPS_MAX}", id="job-capture-error"), \
                dash.no_update
        try:
            with client_for(auth) as c:
                capture = c.request_capture(job_id, kind=kind or "kineto", steps=steps)
        except ApiError as exc:
            return error_box(exc, id="job-capture-error"), dash.no_update
        done = html.Div(["Capture ", html.B(capture.capture_id), f" ({capture.kind}, {capture.steps:,} steps): ",
                         html.Span(capture.state, id="job-capture-state")], className="notice")
        return done, {"capture_id": capture.capture_id, "n": n}

    @app.callback(Output("job-download", "data"), Input("job-download-button", "n_clicks"), State("job-id", "data"),
                  State("auth", "data"), prevent_initial_call=True)
    def _download(n: int, job_id: str, auth: AuthStore | None):
        if not n:
            raise PreventUpdate
        try:
            with client_for(auth) as c:
                html_text = c.report_html(job_id)
        except ApiError:
            raise PreventUpdate from None
        safe = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in job_id)
        return dcc.send_string(html_text, f"fleetprof-report-{safe}.html", type="text/html")


def register_pages() -> None:
    """Add this module's page(s) to dash.page_registry (once per process, after the first app exists)."""
    dash.register_page(__name__, path_template="/jobs/<job_id>", name="Job", title="fleetprof · job", layout=layout)
