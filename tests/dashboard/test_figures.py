"""Pure pieces of the dashboard: figure builders, number formatting, zoom parsing, estimate form."""

from __future__ import annotations

import math

import plotly.graph_objects as go
import pytest

from dashboard import figures
from dashboard import format as fmt
from dashboard.pages.estimate import build_request

GIB = 2**30


def _series(uuid: str, ts: list[float], values: list[float | None]) -> dict:
    return {"gpu_uuid": uuid, "ts": ts, "values": values, "raw_points": len(ts), "min": None, "max": None}


def test_memory_timeline_draws_nvml_framework_and_capacity() -> None:
    used = {"job_id": "j", "series": [_series("GPU-a", [0.0, 1.0, 2.0], [1 * GIB, 3 * GIB, 2 * GIB]),
                                      _series("GPU-b", [0.0, 1.0], [GIB, GIB])]}
    steps = {"count": 2, "rank": [0, 0], "ts": [0.5, 1.5], "wall_s": [0.1, 0.2],
             "allocated_peak_bytes": [GIB, 2 * GIB], "reserved_peak_bytes": [2 * GIB, 2.5 * GIB]}
    fig = figures.memory_timeline(used, steps, capacity_bytes=80 * GIB)
    assert isinstance(fig, go.Figure)
    assert all(isinstance(t, go.Scattergl) for t in fig.data)  # WebGL for dense series
    names = [t.name for t in fig.data]
    assert sum("NVML used" in n for n in names) == 2
    assert any("allocated" in n for n in names) and any("reserved" in n for n in names)
    assert list(fig.data[0].y) == [1.0, 3.0, 2.0]  # GiB
    assert list(fig.data[0].x) == [0.0, 1000.0, 2000.0]  # epoch ms on a date axis
    assert fig.layout.xaxis.type == "date"
    assert fig.layout.shapes[0].y0 == 80.0  # the capacity line, in GiB


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


def test_step_time_histogram_in_ms_with_percentiles() -> None:
    fig = figures.step_time_histogram([0.1, 0.2, None, 0.3], p50_s=0.2, p95_s=0.3)
    assert list(fig.data[0].x) == pytest.approx([100.0, 200.0, 300.0])
    assert "3 steps" in fig.layout.title.text
    assert len(fig.layout.shapes) == 2
    assert not figures.step_time_histogram([]).data  # no hooks: a message, not an empty histogram


def test_layer_bars_largest_on_top() -> None:
    layers = [{"module": "fc", "forward_s": 2.0, "backward_s": 3.0, "total_s": 5.0},
              {"module": "conv", "forward_s": 1.0, "backward_s": None, "total_s": 1.0}]
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
    energy = figures.energy_over_time(timeline)
    assert energy.data[0].y[0] == pytest.approx(1.0) and math.isnan(energy.data[0].y[1])  # kWh; unknown stays a gap
    assert not figures.utilization_heatmap({"hours": [], "gpus": []}).data


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
    assert fmt.timestamp(0) == "1970-01-01 00:00:00 UTC"


def test_by_suffix_reads_the_unit_from_the_name() -> None:
    from dashboard.components import by_suffix

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
