"""Pure pieces of the dashboard: figure builders, number formatting, zoom parsing, estimate form."""

from __future__ import annotations

import math

import plotly.graph_objects as go
import pytest

from dashboard import figures
from dashboard import format as fmt
from dashboard.pages.estimate import build_request
from fleetprof.report import LayerRow

GIB = 2**30


def _series(uuid: str, ts: list[float], values: list[float | None]) -> dict:
    return {"gpu_uuid": uuid, "ts": ts, "values": values, "raw_points": len(ts), "min": None, "max": None}


def test_memory_timeline_draws_nvml_framework_and_capacity() -> None:
    used = {"job_id": "j", "series": [_series("GPU-a", [0.0, 1.0, 2.0], [1 * GIB, 3 * GIB, 2 * GIB]),
                                      _series("GPU-b", [0.0, 1.0], [GIB, GIB])]}
    steps = {"count": 4, "rank": [0, 0, 1, 1], "ts": [0.5, 1.5, 0.5, 1.5], "wall_s": [0.1, 0.2, 0.1, 0.2],
             "allocated_peak_bytes": [GIB, 2 * GIB, GIB, GIB],
             "reserved_peak_bytes": [2 * GIB, 2.5 * GIB, 2 * GIB, 2 * GIB]}
    fig = figures.memory_timeline(used, steps, capacity_bytes=80 * GIB)
    assert isinstance(fig, go.Figure)
    # SVG: the API sends ~2 points per pixel; WebGL would fall back to software rendering without a GPU
    assert all(isinstance(t, go.Scatter) for t in fig.data)
    names = [t.name for t in fig.data]
    assert sum("NVML used" in n for n in names) == 2
    assert any("allocated" in n for n in names) and any("reserved" in n for n in names)
    # one legend entry per framework kind, however many ranks; rank r in GPU r's colour
    assert [t.showlegend for t in fig.data if "reserved" in t.name] == [True, False]
    assert [t.line.color for t in fig.data if "allocated" in t.name] == [fig.data[0].line.color, fig.data[1].line.color]
    assert list(fig.data[0].y) == [1.0, 3.0, 2.0]  # GiB
    assert list(fig.data[0].x) == [0.0, 1000.0, 2000.0]  # epoch ms on a date axis
    assert fig.layout.xaxis.type == "date"
    assert fig.layout.shapes[0].y0 == 80.0  # the capacity line, in GiB


def test_memory_timeline_capacity_from_the_series_and_zoom_range() -> None:
    series = _series("GPU-a", [10.0, 11.0], [GIB, GIB]) | {"gpu_index": 3, "memory_total_bytes": 40 * GIB}
    fig = figures.memory_timeline({"series": [series]}, None, x_range=(10.0, 11.0))
    assert fig.layout.shapes[0].y0 == 40.0
    assert "GPU 3" in fig.data[0].name
    assert list(fig.layout.xaxis.range) == [10000.0, 11000.0]  # the zoomed range, on every time plot


def test_memory_timeline_without_steps_or_data() -> None:
    fig = figures.memory_timeline({"series": [_series("GPU-a", [0.0], [GIB])]}, None, None)
    assert len(fig.data) == 1 and not fig.layout.shapes
    empty = figures.memory_timeline({"series": []}, None, 80 * GIB)
    assert not empty.data and "no memory samples" in empty.layout.annotations[0].text


def test_metric_timeline_keeps_unknown_as_gap_not_zero() -> None:
    fig = figures.metric_timeline({"series": [_series("GPU-a", [0.0, 1.0, 2.0], [100.0, None, 300.0])]},
                                  title="Power", y_title="W")
    y = list(fig.data[0].y)
    assert y[0] == 100.0 and math.isnan(y[1]) and y[2] == 300.0


def test_utilization_timeline_overlays_gpm_sm_activity_where_a_gpu_has_it() -> None:
    """GPM's SM activity beside NVML utilization: a dotted line per GPU that has GPM, in the GPU's colour; a GPU
    without GPM (every value null) gets no line rather than one at 0."""
    util = {"series": [_series("GPU-a", [0.0, 1.0], [100.0, 100.0]), _series("GPU-b", [0.0, 1.0], [90.0, 95.0])]}
    sm = {"series": [_series("GPU-a", [0.0, 1.0], [41.0, 43.5]), _series("GPU-b", [0.0, 1.0], [None, None])]}
    fig = figures.metric_timeline(util, title="GPU utilization", y_title="%", overlay=sm, overlay_name="SM activity")
    assert [t.name for t in fig.data] == ["GPU 0", "GPU 1", "GPU 0 SM activity"]
    assert fig.layout.title.text.endswith("; dotted: SM activity")
    dotted = fig.data[2]
    assert dotted.line.dash == "dot" and dotted.line.color == fig.data[0].line.color and list(dotted.y) == [41.0, 43.5]
    plain = figures.metric_timeline(util, title="GPU utilization", y_title="%", overlay=None)
    assert len(plain.data) == 2 and "dotted" not in plain.layout.title.text


def test_step_time_histogram_from_listed_steps_in_ms_with_percentiles() -> None:
    fig = figures.step_time_histogram({"count": 4, "wall_s": [0.1, 0.2, None, 0.3]})
    assert list(fig.data[0].x) == pytest.approx([100.0, 200.0, 300.0])
    assert "3 steps" in fig.layout.title.text
    # a step takes as long as its slowest rank, as the report counts it
    ranks = figures.step_time_histogram({"count": 4, "step": [1, 1, 2, 2], "wall_s": [0.1, 0.3, 0.2, 0.2]})
    assert sorted(ranks.data[0].x) == pytest.approx([200.0, 300.0])
    assert [s.x0 for s in fig.layout.shapes] == pytest.approx([200.0, 290.0])  # p50, p95
    assert not figures.step_time_histogram({"count": 0, "wall_s": []}).data  # no hooks: a message, not an empty plot
    assert "without framework hooks" in figures.step_time_histogram(None).layout.annotations[0].text


def test_step_time_histogram_from_the_apis_counts() -> None:
    hist = {"edges_s": [0.1, 0.2, 0.3, 0.4], "counts": [10, 80, 5], "count": 100, "above": 5, "max_s": 9.0}
    fig = figures.step_time_histogram({"count": 0, "wall_s_histogram": hist}, zoomed=True)
    bars = fig.data[0]
    assert list(bars.x) == pytest.approx([150.0, 250.0, 350.0]) and list(bars.y) == [10, 80, 5]
    assert "100 steps in the zoomed range" in fig.layout.title.text
    assert "5 slower steps, up to 9,000 ms, not shown" in fig.layout.xaxis.title.text
    p50, p95 = (s.x0 for s in fig.layout.shapes)
    assert p50 == pytest.approx(250.0)  # 40 of the 80 steps of the 200-300 ms bin
    assert p95 == pytest.approx(400.0)  # the 95th step is the last counted one


def test_histogram_quantile_past_the_last_bin_is_unknown() -> None:
    assert figures.histogram_quantile([0.0, 1.0], [1], 10, 0.5) is None
    assert figures.histogram_quantile([0.0, 1.0, 2.0], [0, 4], 4, 0.5) == pytest.approx(1.5)


def test_layer_bars_largest_on_top() -> None:
    def row(module: str, forward_s: float, backward_s: float | None, total_s: float | None) -> LayerRow:
        return LayerRow(module=module, module_type=None, forward_s=forward_s, backward_s=backward_s,
                        activation_bytes=None, calls=1, total_s=total_s, parent=None, self_time_s=None,
                        time_fraction=None, self_time_fraction=None)

    layers = [row("fc", 2.0, 3.0, 5.0), row("conv", 1.0, None, 1.0), row("untimed", 1.0, 1.0, None)]
    fig = figures.layer_time_bars(layers)
    assert list(fig.data[0].y) == ["conv", "fc"] and list(fig.data[1].x) == [0.0, 3.0]


def test_utilization_heatmap_rows_and_gaps() -> None:
    timeline = {"hours": [3600.0, 7200.0], "gpus": [{"node": "n1", "index": 0, "uuid": "a"},
                                                    {"node": "n1", "index": 1, "uuid": "b"}],
                "gpu_util_mean_pct": [[10.0, None], [90.0, 50.0]], "energy_j": [3.6e6, None], "energy_gpus": [2, 0]}
    fig = figures.utilization_heatmap(timeline)
    hm = fig.data[0]
    assert list(hm.y) == ["n1 · GPU 0", "n1 · GPU 1"]
    assert hm.z[0][0] == 10.0 and math.isnan(hm.z[0][1])
    assert (hm.zmin, hm.zmax) == (0, 100)
    assert not figures.utilization_heatmap({"hours": [], "gpus": []}).data


def test_energy_from_the_hardware_counter_says_so() -> None:
    timeline = {"hours": [3600.0, 7200.0], "energy_j": [3.6e6, None], "energy_gpus": [2, 0],
                "energy_by_source_j": {"hardware_counter": [3.6e6, None]}, "energy_source": ["hardware_counter", None]}
    fig = figures.energy_over_time(timeline)
    assert fig.data[0].y[0] == pytest.approx(1.0) and math.isnan(fig.data[0].y[1])  # kWh; unknown stays a gap
    assert fig.data[0].name == "NVML energy counter"
    assert fig.layout.title.subtitle.text == "source: NVML energy counter"


def test_energy_from_integrated_power_says_so() -> None:
    timeline = {"hours": [3600.0], "energy_j": [7.2e6], "energy_gpus": [3],
                "energy_by_source_j": {"integrated_power": [7.2e6]}, "energy_source": ["integrated_power"]}
    fig = figures.energy_over_time(timeline)
    assert fig.layout.title.subtitle.text == "source: integrated power"
    assert fig.data[0].y[0] == pytest.approx(2.0)


def test_energy_from_both_sources_is_stacked_with_shares() -> None:
    timeline = {"hours": [3600.0, 7200.0], "energy_j": [4e6, 4e6], "energy_gpus": [2, 2],
                "energy_by_source_j": {"hardware_counter": [3e6, 3e6], "integrated_power": [1e6, 1e6]},
                "energy_source": ["mixed", "mixed"]}
    fig = figures.energy_over_time(timeline)
    assert [t.name for t in fig.data] == ["NVML energy counter", "integrated power"]
    assert fig.layout.barmode == "stack"
    assert fig.layout.title.subtitle.text == "source: NVML energy counter 75 %, integrated power 25 %"


def test_energy_source_unknown_when_the_api_does_not_say() -> None:
    fig = figures.energy_over_time({"hours": [3600.0], "energy_j": [3.6e6], "energy_gpus": [1]})
    assert fig.layout.title.subtitle.text == "source: unknown" and fig.data[0].y[0] == pytest.approx(1.0)
    assert figures.energy_source_shares({"energy_by_source_j": {}}) == "unknown"


def test_memory_plan_bars_in_gib() -> None:
    fig = figures.memory_plan_bars({"lower_bound_bytes": 2 * GIB, "planned_bytes": 3 * GIB,
                                    "observed_reserved_bytes": 6 * GIB}, {"new_peak_bytes": 4 * GIB})
    assert list(fig.data[0].y) == ["observed reserved (allocator)", "swap plan peak", "offset plan peak",
                                   "lower bound (max live)"]
    assert list(fig.data[0].x) == [6.0, 4.0, 3.0, 2.0]
    assert not figures.memory_plan_bars(None, None).data


def test_headroom_histogram_skips_unknown() -> None:
    fig = figures.headroom_histogram({"jobs": [{"headroom_bytes": 10 * GIB}, {"headroom_bytes": None}]})
    assert list(fig.data[0].x) == [10.0]
    assert "1 jobs" in fig.layout.title.text


@pytest.mark.parametrize(("relayout", "expected"), [
    (None, None),
    ({"autosize": True}, None),
    ({"xaxis.autorange": True}, False),
    ({"xaxis.range[0]": "2026-07-14 08:12:38.5", "xaxis.range[1]": "2026-07-14 08:13"}, (1784016758.5, 1784016780.0)),
    ({"xaxis.range": [1784016758500.0, 1784016780000.0]}, (1784016758.5, 1784016780.0)),
])
def test_relayout_range(relayout, expected) -> None:  # type: ignore[no-untyped-def]
    assert figures.relayout_range(relayout) == expected


def test_formatting_says_unknown_never_zero() -> None:
    for f in (fmt.gib, fmt.pct, fmt.fraction_pct, fmt.watts, fmt.energy, fmt.seconds, fmt.grams, fmt.usd, fmt.count,
              fmt.timestamp):
        assert f(None) == "unknown"
    assert fmt.gib(20780679168) == "19.35 GiB"
    assert fmt.gib(0) == "0.00 GiB"  # a real zero stays zero
    assert fmt.energy(5143.1) == "5.1 kJ" and fmt.energy(7.2e6) == "2.00 kWh"
    assert fmt.seconds(0.0123) == "12.3 ms" and fmt.fraction_pct(0.5) == "50.0 %"
    assert fmt.usd(-291.84) == "-$291.84" and fmt.usd(0.005) == "$0.0050" and fmt.usd(0) == "$0.00"
    assert fmt.timestamp(0) == "1970-01-01 00:00:00 UTC"


def test_sources_in_words() -> None:
    assert fmt.energy_source("hardware_counter") == "NVML energy counter"
    assert fmt.energy_source("integrated_power") == "integrated power"
    assert fmt.energy_source(None) == "unknown"
    assert fmt.source("nvml:gpu_util_pct") == "NVML (gpu_util_pct)"
    assert fmt.source("cuda_allocator").startswith("PyTorch caching allocator")
    assert fmt.source("something new") == "something new" and fmt.source(None) is None


def test_by_suffix_reads_the_unit_from_the_name() -> None:
    from dashboard.components import by_suffix

    assert by_suffix("usd", 552.96) == "$552.96"
    assert by_suffix("usd_per_gpu_hour", 2.88) == "$2.88 per GPU-hour"
    assert by_suffix("planned_peak_bytes", 2 * GIB) == "2.00 GiB"
    assert by_suffix("pcie_time_s", 0.5) == "500.0 ms"
    assert by_suffix("saved_fraction", 0.25) == "25.0 %"
    assert by_suffix("anything_bytes", None) == "unknown"


def test_estimate_request_from_the_form() -> None:
    req = build_request(source="factory", model="torchvision.models:resnet18", shape="3,224,224", seq_len=None,
                        batch=32, optimizer="sgd", precision="amp_bf16", accum=None, options=["ckpt"], gpus="H100-80GB, A100-40GB")
    assert req == {"batch_size": 32, "optimizer": "sgd", "precision": "amp_bf16", "grad_accumulation": 1,
                   "activation_checkpointing": True, "search_max_batch": False,
                   "model": {"factory": "torchvision.models:resnet18"}, "inputs": [{"shape": [3, 224, 224]}],
                   "gpu_types": ["H100-80GB", "A100-40GB"]}
    hf = build_request(source="hf", model="gpt2", shape="", seq_len=512, batch=4, optimizer="adamw",
                       precision="fp32", accum=2, options=["search"], gpus="")
    assert hf["model"] == {"hf_config": "gpt2"} and hf["seq_len"] == 512 and "gpu_types" not in hf
    for bad in ({"model": ""}, {"batch": 0}, {"model": "no_colon", "source": "factory"}, {"shape": "3,a"}):
        kwargs = dict(source="factory", model="m:f", shape="3", seq_len=None, batch=1, optimizer="adamw",
                      precision="fp32", accum=1, options=[], gpus=None)
        kwargs.update(bad)
        with pytest.raises(ValueError):
            build_request(**kwargs)  # type: ignore[arg-type]


def test_hourly_figures_of_a_single_hour_have_hour_ticks_not_milliseconds() -> None:
    """One hour of rollups is one column: plotly autoranged it to a sliver (sub-millisecond ticks). The axis now
    spans that hour, with hourly ticks, and the column is one hour wide."""
    h = 1_764_064_800.0  # 2025-11-25 10:00 UTC
    timeline = {"hours": [h], "gpus": [{"node": "n1", "index": 0, "uuid": "a"}], "gpu_util_mean_pct": [[42.0]],
                "energy_j": [3.6e6], "energy_gpus": [1], "energy_by_source_j": {"hardware_counter": [3.6e6]}}
    for fig in (figures.utilization_heatmap(timeline), figures.energy_over_time(timeline)):
        axis = fig.layout.xaxis
        assert axis.type == "date" and axis.autorange is False
        assert list(axis.range) == [h * 1000, (h + 3600) * 1000]
        assert axis.dtick == 3600e3 and axis.tick0 == h * 1000
    hm = figures.utilization_heatmap(timeline).data[0]
    assert (hm.x0, hm.dx) == (h * 1000 + 1800e3, 3600e3)


def test_heatmap_columns_are_hours_with_gaps_and_long_windows_keep_plotly_ticks() -> None:
    h = 1_764_064_800.0
    gpus = [{"node": "n1", "index": 0, "uuid": "a"}]
    fig = figures.utilization_heatmap({"hours": [h, h + 7200], "gpus": gpus, "gpu_util_mean_pct": [[10.0, 30.0]]})
    z = fig.data[0].z
    assert z[0][0] == 10.0 and math.isnan(z[0][1]) and z[0][2] == 30.0  # the hour with no rollup is a gap
    assert fig.layout.xaxis.dtick == 3600e3
    week = [h + 3600 * k for k in range(7 * 24)]
    fig = figures.utilization_heatmap({"hours": week, "gpus": gpus, "gpu_util_mean_pct": [[50.0] * len(week)]})
    assert fig.layout.xaxis.dtick is None and list(fig.layout.xaxis.range) == [h * 1000, (week[-1] + 3600) * 1000]
