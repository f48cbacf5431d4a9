"""TensorFlow profiler traces (trace viewer JSON) read by the Kineto summarizer: detection, steps, layer scopes.

The trace is a real TF 2.21 CPU profile of three train steps of a Keras CNN (`tests/data/tf-profiler`, made by
`make_trace.py` beside it); its expected figures were read from the file independently (the three `FunctionRun`
events of the profiled step function, which span their step groups).
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from server.analysis.traces.kineto import combine_ranks, summarize_trace
from server.analysis.traces.tf_trace import TfTraceReader, layer_scope

TF_TRACE = "tf-profiler/keras-cnn-cpu.trace.json.gz"


def test_a_tf_trace_is_detected_with_its_steps_and_layer_scopes(real_data: Path) -> None:
    path = real_data / TF_TRACE
    s = summarize_trace(path)
    assert s.format == "tensorflow"
    # the step function's runs, read from the file
    events = json.loads(gzip.decompress(path.read_bytes()))["traceEvents"]
    runs = sorted((e["ts"], e["dur"]) for e in events if e.get("name") == "FunctionRun"
                  and "group_id" in (e.get("args") or {}))
    assert len(runs) == len(s.steps) == 3
    for (ts, dur), step in zip(runs, s.steps, strict=True):
        assert step.start_us <= ts and step.start_us + step.duration_us >= ts + dur - 1e-6
        assert step.duration_us == pytest.approx(dur, rel=0.05)
    assert s.counts["cpu_ops"] > 100 and s.gpu_time is None and s.top_kernels == []
    scopes = {r.scope: r for r in s.scopes}
    conv, head = scopes["sequential_1/conv_1"], scopes["sequential_1/head_1"]
    assert conv.forward_us > head.forward_us > 0 and conv.backward_us > 0 and head.backward_us > 0
    assert "adam" in scopes and scopes["adam"].backward_us == 0  # the optimizer's ops: one scope, no gradient
    row = combine_ranks([s])["per_rank"][0]
    assert row["format"] == "tensorflow" and row["steps"] == 3 and row["scopes"][0]["scope"] == "sequential_1/conv_1"


def test_a_kineto_trace_stays_kineto(real_data: Path) -> None:
    s = summarize_trace(real_data / "kineto/param/resnet_kineto.json.gz")
    assert s.format == "kineto" and s.scopes == [] and s.counts["kernels"] > 0


@pytest.mark.parametrize(("long_name", "expected"), [
    ("StatefulPartitionedCall/sequential_1/conv_1/Relu:_MklNativeFusedConv2D", ("sequential_1/conv_1", False)),
    ("StatefulPartitionedCall/gradient_tape/sequential_1/head_1/MatMul/MatMul_1:_MklMatMul",
     ("sequential_1/head_1", True)),
    ("PartitionedCall/model/block/conv/Conv2D:Conv2D", ("model/block", False)),
    ("StatefulPartitionedCall/adam/Sub_15/ReadVariableOp:ReadVariableOp", ("adam", False)),
    ("StatefulPartitionedCall/Identity:Identity", None),
])
def test_layer_scope(long_name: str, expected: tuple[str, bool] | None) -> None:
    assert layer_scope(long_name) == expected


def test_gpu_plane_streams_become_gpu_activities() -> None:
    """The trace viewer's GPU plane: its `Stream #` lines are GPU activities; its derived lines are not."""
    reader = TfTraceReader()
    for ev in [{"ph": "M", "name": "process_name", "pid": 1, "args": {"name": "/device:GPU:1"}},
               {"ph": "M", "name": "thread_name", "pid": 1, "tid": 7, "args": {"name": "Stream #7(Compute)"}},
               {"ph": "M", "name": "thread_name", "pid": 1, "tid": 8, "args": {"name": "TensorFlow Ops"}}]:
        reader.note_metadata(ev)
    assert reader.active
    kernel = reader.normalize({"ph": "X", "pid": 1, "tid": 7, "ts": 10.0, "dur": 5.0, "name": "volta_sgemm",
                               "args": {"group_id": "4"}})
    assert kernel is not None and kernel["cat"] == "kernel" and kernel["args"] == {"stream": 7, "device": 1}
    assert reader.normalize({"ph": "X", "pid": 1, "tid": 8, "ts": 10.0, "dur": 5.0, "name": "MatMul"}) is None
    assert reader.steps() == {0: (10.0, 5.0)}
