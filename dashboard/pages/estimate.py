"""Pre-training estimate: peak memory, which GPUs it fits, largest batch size, time and energy per step."""

from __future__ import annotations

from typing import Any

import dash
from dash import Input, Output, State, dcc, html
from dash.exceptions import PreventUpdate

from dashboard import format as fmt
from dashboard.client import ApiError, EstimatorUnavailable
from dashboard.components import client_for, error_box, kpi, section, table
from dashboard.figures import memory_breakdown_bar
from dashboard.session import AuthStore

OPTIMIZERS = ("adamw", "adam", "sgd", "sgd_momentum", "adagrad", "rmsprop")
PRECISIONS = (("fp32", "fp32"), ("AMP fp16", "amp_fp16"), ("AMP bf16", "amp_bf16"))


def layout(**_: Any) -> html.Div:
    def field(label: str, control: Any) -> html.Label:
        return html.Label([html.Span(label, className="field-label"), control], className="field")

    return html.Div([
        html.H2("Pre-training estimate"),
        html.P("How much GPU memory will this training need, which GPU types hold it, the largest batch size that "
               "fits, and time and energy per step (roofline model).", className="muted"),
        html.Div([
            field("model source", dcc.RadioItems(id="est-source", value="hf", inline=True, options=[
                {"label": " Hugging Face model type / config", "value": "hf"},
                {"label": " registered or zoo factory (module:function)", "value": "factory"}])),
            field("model", dcc.Input(id="est-model", type="text", value="gpt2", className="text-input")),
            field("input shape (factory models, without batch; e.g. 3,224,224)",
                  dcc.Input(id="est-shape", type="text", value="", className="text-input")),
            field("sequence length (text models)", dcc.Input(id="est-seq-len", type="number", value=1024, min=1)),
            field("batch size (per GPU)", dcc.Input(id="est-batch", type="number", value=8, min=1)),
            field("optimizer", dcc.Dropdown(id="est-optimizer", options=list(OPTIMIZERS), value="adamw",
                                            clearable=False, className="dropdown")),
            field("precision", dcc.Dropdown(id="est-precision", options=[{"label": k, "value": v}
                                                                         for k, v in PRECISIONS],
                                            value="fp32", clearable=False, className="dropdown")),
            field("gradient accumulation", dcc.Input(id="est-accum", type="number", value=1, min=1)),
            dcc.Checklist(id="est-options", options=[{"label": " activation checkpointing", "value": "ckpt"},
                                                     {"label": " search the largest batch size", "value": "search"}],
                          value=["search"]),
            field("GPU types (comma-separated; empty = whole catalogue)",
                  dcc.Input(id="est-gpus", type="text", value="", className="text-input")),
            html.Button("Estimate", id="est-submit", n_clicks=0),
        ], className="card form"),
        dcc.Loading(html.Div(id="est-result"), type="dot"),
    ])


def build_request(*, source: str, model: str | None, shape: str | None, seq_len: int | None, batch: int | None,
                  optimizer: str, precision: str, accum: int | None, options: list[str] | None,
                  gpus: str | None) -> dict[str, Any]:
    """The POST /api/v1/estimate body from the form; ValueError with a message for the user when incomplete."""
    model = (model or "").strip()
    if not model:
        raise ValueError("give a model")
    if not batch or batch < 1:
        raise ValueError("batch size must be at least 1")
    req: dict[str, Any] = {"batch_size": int(batch), "optimizer": optimizer, "precision": precision,
                           "grad_accumulation": int(accum or 1), "activation_checkpointing": "ckpt" in (options or []),
                           "search_max_batch": "search" in (options or [])}
    if source == "factory":
        if ":" not in model:
            raise ValueError("a factory is written 'package.module:function'")
        req["model"] = {"factory": model}
        if (shape or "").strip():
            try:
                dims = [int(x) for x in shape.replace("x", ",").split(",") if x.strip()]  # type: ignore[union-attr]
            except ValueError:
                raise ValueError("input shape: integers separated by commas, e.g. 3,224,224") from None
            req["inputs"] = [{"shape": dims}]
    else:
        req["model"] = {"hf_config": model}
        if seq_len:
            req["seq_len"] = int(seq_len)
    names = [g.strip() for g in (gpus or "").split(",") if g.strip()]
    if names:
        req["gpu_types"] = names
    return req


def result_view(res: dict[str, Any]) -> html.Div:
    kpis = html.Div([
        kpi("Parameters", f"{fmt.count(res.get('parameter_count'))} ({fmt.gib(res.get('parameter_bytes'))})",
            "model traced on the meta device", id="est-params"),
        kpi("Peak allocated", fmt.gib(res.get("peak_allocated_bytes")), "simulated caching allocator",
            id="est-peak-allocated"),
        kpi("Peak reserved", fmt.gib(res.get("peak_reserved_bytes")), "simulated caching allocator",
            id="est-peak-reserved"),
    ], className="kpis")
    rows = []
    for g in res.get("gpus") or []:
        roof = g.get("roofline") or {}
        rows.append([fmt.text(g.get("gpu")), fmt.gib(g.get("memory_total_bytes")), fmt.gib(g.get("device_total_bytes")),
                     "fits" if g.get("fits") else "does not fit", fmt.gib(g.get("headroom_bytes")),
                     fmt.count(g.get("max_batch_size")) + ("" if g.get("max_batch_size_exact", True) else " (≥)"),
                     fmt.seconds(roof.get("time_per_step_s")), fmt.energy(roof.get("energy_per_step_j")),
                     fmt.text(g.get("calibration_source"))])
    assumptions = html.Ul([html.Li(a) for a in res.get("assumptions") or []])
    return html.Div([kpis, section("Per GPU type", table(
        ["GPU", "capacity", "device total (peak reserved + context)", "fits", "headroom", "largest batch",
         "time / step", "energy / step", "calibration"], rows, id="est-gpus-table")),
        section("Memory at the peak", dcc.Graph(id="est-breakdown", figure=memory_breakdown_bar(
            [("tensors (no GPU)", res.get("breakdown"))]
            + [(g.get("gpu") or "?", g.get("breakdown")) for g in res.get("gpus") or []]),
            config={"displaylogo": False})),
        section("Assumptions", assumptions)], id="est-answer")


def register_callbacks(app: dash.Dash) -> None:
    @app.callback(Output("est-result", "children"), Input("est-submit", "n_clicks"),
                  State("est-source", "value"), State("est-model", "value"), State("est-shape", "value"),
                  State("est-seq-len", "value"), State("est-batch", "value"), State("est-optimizer", "value"),
                  State("est-precision", "value"), State("est-accum", "value"), State("est-options", "value"),
                  State("est-gpus", "value"), State("auth", "data"), prevent_initial_call=True)
    def _estimate(n: int, source: str, model: str, shape: str, seq_len: int, batch: int,
                  optimizer: str, precision: str, accum: int, options: list[str], gpus: str,
                  auth: AuthStore | None):
        if not n:
            raise PreventUpdate
        try:
            req = build_request(source=source, model=model, shape=shape, seq_len=seq_len, batch=batch,
                                optimizer=optimizer, precision=precision, accum=accum, options=options, gpus=gpus)
        except ValueError as exc:
            return error_box(str(exc))
        try:
            with client_for(auth) as c:
                return result_view(c.estimate(req))
        except EstimatorUnavailable:
            return html.Div("The estimator is not available on this API server (POST /api/v1/estimate is not "
                            "served yet).", className="notice", id="est-unavailable")
        except ApiError as exc:
            return error_box(exc)


def register_pages() -> None:
    """Add this module's page(s) to dash.page_registry (once per process, after the first app exists)."""
    dash.register_page(__name__, path="/estimate", name="Estimator", title="fleetprof · estimator", order=3,
                       layout=layout)
