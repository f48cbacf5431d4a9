"""Nodes (operators): inventory, health, last seen; node detail with its GPUs, their recent NVML GPM means and
current jobs."""

from __future__ import annotations

from typing import Any, cast
from urllib.parse import unquote

import dash
from dash import Input, Output, dcc, html

from dashboard import data
from dashboard import format as fmt
from dashboard.client import ApiError, gather
from dashboard.components import client_for, error_box, findings_list, job_link, node_link, section, table
from dashboard.session import AuthStore

GPM_WINDOW_S = 300.0  # the node page's recent window for GPM means


def layout(**_: Any) -> html.Div:
    return html.Div([html.H2("Nodes"), dcc.Loading(html.Div(id="nodes-table"), type="dot")])


def detail_layout(node: str | None) -> html.Div:
    name = unquote(node or "")
    return html.Div([
        dcc.Store(id="node-name", data=name),
        html.H2(["Node ", html.Span(name, id="node-title")]),
        dcc.Loading(html.Div(id="node-detail"), type="dot"),
    ])


def register_callbacks(app: dash.Dash) -> None:
    @app.callback(Output("nodes-table", "children"), Input("auth", "data"))
    def _nodes(auth: AuthStore | None):
        try:
            with client_for(auth) as c:
                nodes, gpus = c.nodes(), c.gpus()
        except ApiError as exc:
            return error_box(exc)
        unhealthy: dict[str, int] = {}
        for g in gpus:
            if not g["healthy"]:
                unhealthy[g["node"]] = unhealthy.get(g["node"], 0) + 1
        rows = [[node_link(n["name"]), fmt.count(n["gpu_count"]),
                 f"{unhealthy.get(n['name'], 0)} unhealthy" if unhealthy.get(n["name"]) else "healthy",
                 fmt.text(n.get("source")), fmt.text(n.get("driver_version")), fmt.text(n.get("cuda_version")),
                 fmt.timestamp(n.get("last_seen_at")), fmt.count(n.get("dropped_samples_total"), "samples"),
                 fmt.seconds(abs(n["clock_skew_s"])) if n.get("clock_skew_s") is not None else fmt.UNKNOWN]
                for n in nodes]
        return table(["node", "GPUs", "health", "source", "driver", "CUDA", "last seen", "dropped", "clock skew"],
                     rows, id="nodes-list", empty="no nodes have reported yet")

    @app.callback(Output("node-detail", "children"), Input("node-name", "data"), Input("auth", "data"))
    def _detail(name: str, auth: AuthStore | None):
        try:
            with client_for(auth) as c:
                gpus_doc, gpm_doc, jobs_doc = gather(lambda: c.gpus(node=name), lambda: c.gpu_gpm(name, GPM_WINDOW_S),
                                                     lambda: c.jobs(state="running", limit=1000))
                for answer in (gpus_doc, jobs_doc):
                    if isinstance(answer, ApiError):
                        raise answer
                gpus, running = cast("list[dict[str, Any]]", gpus_doc), data.job_list(jobs_doc).items
        except ApiError as exc:
            return error_box(exc)
        if not gpus:
            return error_box(f"no GPUs known on node {name!r}")
        uuids = {g["uuid"] for g in gpus}
        jobs = [j for j in running if j.node == name or uuids.intersection(j.gpu_uuids)]
        gpu_rows = [[str(g["index"]), fmt.text(g["name"]), fmt.gib(g.get("memory_total_bytes")),
                     "healthy" if g["healthy"] else "UNHEALTHY", fmt.watts(g.get("power_limit_w")),
                     fmt.text(g.get("power_source")),
                     f"slice of {g['mig_parent_uuid']}" if g.get("mig_parent_uuid") else "no",  # known: not unknown
                     fmt.timestamp(g.get("last_seen_at")), g["uuid"]] for g in gpus]
        job_rows = [[job_link(j.job_id), fmt.text(j.name), fmt.text(j.team), fmt.count(len(j.gpu_uuids), "GPUs"),
                     fmt.timestamp(j.started_at)] for j in jobs]
        return [attention_section(gpus),
                section("GPUs", table(["GPU", "model", "memory", "health", "power limit", "power source", "MIG device",
                                       "last seen", "uuid"], gpu_rows, id="node-gpus")),
                gpm_section(gpm_doc),
                section("Current jobs", table(["job", "name", "team", "GPUs", "started"], job_rows,
                                              id="node-jobs", empty="no running job on this node"))]


def attention_section(gpus: list[dict[str, Any]]) -> Any:
    """The node's GPUs with health findings over the last hour (`GET /api/v1/gpus?node=N`'s `findings`)."""
    # findings: null from a collector that predates them (unknown), [] when checked and clean
    attention = [[str(g["index"]), fmt.text(g["name"]), findings_list(g["findings"]), g["uuid"]]
                 for g in gpus if g.get("findings")]
    checked = any(g.get("findings") is not None for g in gpus)
    return section("GPUs needing attention (last hour)",
                   table(["GPU", "model", "findings", "uuid"], attention, id="node-attention",
                         empty="no GPU needs attention" if checked else "unknown (the API gave no findings)"))


def gpm_section(gpm: Any) -> Any:
    """The node's GPUs' NVML GPM means over the recent window ("unknown" for a GPU without GPM); a failed call
    shows as an error in this section only."""
    if isinstance(gpm, ApiError):
        return section("GPU efficiency (NVML GPM)", error_box(gpm))
    rows = [[str(g["index"]), fmt.pct(g.get("sm_activity_mean_pct")), fmt.pct(g.get("sm_occupancy_mean_pct")),
             fmt.pct(g.get("tensor_activity_mean_pct")), fmt.pct(g.get("dram_bw_util_mean_pct")),
             f"{fmt.bytes_per_s(g.get('pcie_tx_mean_bytes_per_s'))} / "
             f"{fmt.bytes_per_s(g.get('pcie_rx_mean_bytes_per_s'))}",
             f"{fmt.bytes_per_s(g.get('nvlink_tx_mean_bytes_per_s'))} / "
             f"{fmt.bytes_per_s(g.get('nvlink_rx_mean_bytes_per_s'))}",
             fmt.count(g.get("samples")), fmt.timestamp(g.get("last_ts")),
             g.get("source") or "unknown (no GPM samples)", g["uuid"]] for g in gpm]
    return section(f"GPU efficiency (NVML GPM, means over the last {GPM_WINDOW_S / 60:g} minutes)",
                   table(["GPU", "SM activity", "SM occupancy", "tensor activity", "DRAM bandwidth", "PCIe tx / rx",
                          "NVLink tx / rx", "samples", "latest", "source", "uuid"], rows, id="node-gpm",
                         empty="no GPUs known"))


def register_pages() -> None:
    """Add this module's page(s) to dash.page_registry (once per process, after the first app exists)."""
    dash.register_page(__name__, path="/nodes", name="Nodes", title="fleetprof · nodes", order=1, layout=layout)
    dash.register_page(f"{__name__}.detail", path_template="/nodes/<node>", name="Node",
                       title="fleetprof · node", layout=lambda node=None, **_: detail_layout(node))
