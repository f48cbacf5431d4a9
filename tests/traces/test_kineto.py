"""server.analysis.traces.kineto and traces.reader on real Kineto traces, plus small hand-built ones for the exact rules."""

from __future__ import annotations

import gzip
import io
import json
import tracemalloc
from pathlib import Path
from typing import Any

import pytest

from server.analysis.traces import reader
from server.analysis.traces.kineto import (
    TraceFormatError,
    TraceTooLargeError,
    combine_ranks,
    kernel_category,
    summarize_trace,
)

V100 = "hta/df_index_resolver/df_index_resolver.json.gz"  # rank 1 of 2, 28k [memory] events
TB_2021 = "kineto-tb/samples/resnet50_num_workers_0/worker0.1623143089861.pt.trace.json.gz"  # Bytes only
NCCL = "hta/nccl_parser_config/nccl_data.json.gz"


def _trace(events: list[dict[str, Any]], **meta: Any) -> bytes:
    return json.dumps({"schemaVersion": 1, **meta, "traceEvents": events}).encode()


def _kernel(name: str, ts: float, dur: float, corr: int, cat: str = "kernel") -> dict[str, Any]:
    return {"ph": "X", "cat": cat, "name": name, "pid": 0, "tid": 7, "ts": ts, "dur": dur,
            "args": {"device": 0, "stream": 7, "correlation": corr}}


def _launch(ts: float, corr: int) -> dict[str, Any]:
    return {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": ts,
            "dur": 1, "args": {"correlation": corr}}


def _step(n: int, ts: float, dur: float) -> dict[str, Any]:
    return {"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{n}", "pid": 1, "tid": 1, "ts": ts,
            "dur": dur, "args": {}}


# ----------------------------------------------------------------------------------- exact rules


def test_categories_split_busy_time_by_priority_and_add_up_to_the_span() -> None:
    events = [
        _launch(0, 1), _kernel("void gemm_kernel<float>()", 0, 10, 1),            # compute [0,10)
        _launch(1, 2), _kernel("ncclKernel_AllReduce_RING_LL_Sum_float", 5, 15, 2),  # comm [5,20)
        _launch(2, 3), _kernel("Memcpy HtoD (Pageable -> Device)", 18, 7, 3, "gpu_memcpy"),  # [18,25)
        _launch(3, 4), _kernel("Memset (Device)", 22, 2, 4, "gpu_memset"),         # hidden under memcpy
        _launch(4, 5), _kernel("elementwise_kernel", 30, 10, 5),                    # compute [30,40)
    ]
    g = summarize_trace(_trace(events)).gpu_time
    assert g is not None
    assert (g.span_us, g.busy_us, g.idle_us) == (40, 35, 5)
    assert (g.compute_us, g.communication_us, g.memcpy_us, g.memset_us) == (20, 10, 5, 0)
    assert g.non_compute_us == 15
    assert g.idle_pct + g.compute_pct + g.non_compute_pct == pytest.approx(100)
    assert not g.last_step_excluded


def test_last_profiler_step_is_left_out_as_hta_does() -> None:
    events = [
        _step(1, 0, 100), _launch(10, 1), _kernel("k1", 20, 10, 1),
        _step(2, 100, 100), _launch(110, 2), _kernel("k2", 120, 10, 2),
        _step(3, 200, 100), _launch(210, 3), _kernel("k3", 220, 50, 3),  # incomplete last step
    ]
    s = summarize_trace(_trace(events))
    assert s.gpu_time is not None and s.gpu_time.last_step_excluded
    assert s.gpu_time.span_us == 110  # 20..130: k3 dropped
    assert s.gpu_time.activities == 2
    assert [(st.step, st.duration_us) for st in s.steps] == [(1, 100), (2, 100), (3, 100)]
    assert s.counts["kernels"] == 3  # counted, only left out of the time window


def test_ns_timestamps_are_rounded_like_hta_but_never_to_negative_lengths() -> None:
    events = [_launch(0.5, 1), _kernel("k", 1.2, 0.5, 1), _launch(1, 2), _kernel("k", 2.5, 10.0, 2)]
    g = summarize_trace(_trace(events)).gpu_time
    assert g is not None
    # [1.2,1.7) -> [2,1): length 0, not -1; [2.5,12.5) -> [3,12)
    assert (g.span_us, g.busy_us, g.idle_us) == (10, 9, 1)


@pytest.mark.parametrize(
    ("name", "category"),
    [
        ("ncclDevKernel_AllGather_RING_LL(ncclDevComm*, unsigned long, ncclWork*)", "communication"),
        ("Memcpy DtoH (Device -> Pinned)", "memcpy"),
        ("Memset (Device)", "memset"),
        ("void cudnn::bn_fw_tr_1C11_kernel_NCHW<float>()", "compute"),
        ("cudaStreamSynchronize", "other"),
    ],
)
def test_kernel_category(name: str, category: str) -> None:
    from server.analysis.traces.kineto import CATEGORY_NAMES

    assert CATEGORY_NAMES[kernel_category(name)] == category


# ----------------------------------------------------------------------------------- real traces


def test_v100_training_trace(kineto_dir: Path) -> None:
    s = summarize_trace(kineto_dir / V100)
    assert (s.rank, s.world_size, s.distributed_backend) == (1, 2, "nccl")
    assert s.device is not None and s.device.device_id == 1
    assert s.device.name == "Tesla V100-SXM2-32GB" and s.device.memory_total_bytes == 34089730048
    assert [st.step for st in s.steps] == [2, 3, 4, 5, 6]
    assert all(300_000 < st.duration_us < 400_000 for st in s.steps)
    assert s.counts["kernels"] + s.counts["communication_kernels"] == 19370
    assert s.counts["memcpy"] == 2040 and s.counts["memset"] == 880
    assert s.counts["memory_events"] == 28010
    totals = [k.total_us for k in s.top_kernels]
    assert totals == sorted(totals, reverse=True) and len(totals) == 20
    cuda = next(m for m in s.memory if m.device == "cuda:1")
    assert cuda.source == "total_allocated" and cuda.samples > 26_000
    assert len(cuda.ts_us) <= 1002 and cuda.ts_us == sorted(cuda.ts_us)
    assert max(cuda.allocated_bytes) == cuda.peak_allocated_bytes  # downsampling keeps the peak
    assert s.peak_allocated_bytes == cuda.peak_allocated_bytes
    assert s.peak_allocated_bytes is not None and s.peak_reserved_bytes is not None
    assert 0 < s.peak_allocated_bytes <= s.peak_reserved_bytes <= s.device.memory_total_bytes
    json.dumps(s.to_dict(), allow_nan=False)


def test_2021_trace_rebuilds_memory_from_byte_deltas(kineto_dir: Path) -> None:
    s = summarize_trace(kineto_dir / TB_2021)
    assert s.rank is None and s.world_size is None
    cuda = next(m for m in s.memory if m.device == "cuda:0")
    assert cuda.source == "bytes_delta" and cuda.reserved_bytes is None and cuda.peak_reserved_bytes is None
    assert min(cuda.allocated_bytes) >= 0
    # ResNet-50 training at batch 32 on a 32 GB V100: GBs, not bytes or TBs
    assert 1 << 30 < cuda.peak_allocated_bytes < 16 << 30
    assert s.peak_reserved_bytes is None
    assert [st.step for st in s.steps] == [5, 6, 7, 8, 9, 10]
    d = s.to_dict()
    assert d["step_time_us"]["p50"] > 0 and d["peak_reserved_bytes"] is None


def test_sources_bytes_path_and_streams_agree(kineto_dir: Path) -> None:
    path = kineto_dir / "hta/trace_filter/sampled_rank-1.json.gz"
    data = path.read_bytes()

    class NonSeekable(io.RawIOBase):
        def __init__(self, b: bytes) -> None:
            self._b = io.BytesIO(b)

        def readable(self) -> bool:
            return True

        def seekable(self) -> bool:
            return False

        def readinto(self, buf: Any) -> int:
            chunk = self._b.read(len(buf))
            buf[: len(chunk)] = chunk
            return len(chunk)

    results = [summarize_trace(src).to_dict() for src in
               (path, data, io.BytesIO(data), NonSeekable(data), gzip.decompress(data))]
    assert all(r == results[0] for r in results[1:])
    assert results[0]["rank"] == 1 and results[0]["world_size"] == 128


def test_memory_stays_bounded_by_a_fraction_of_the_trace(kineto_dir: Path) -> None:
    path = kineto_dir / NCCL
    tracemalloc.start()
    try:
        s = summarize_trace(path)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert s.trace_bytes > 5_000_000
    assert peak < s.trace_bytes / 5, (peak, s.trace_bytes)


# ----------------------------------------------------------------------------------- bad input


def test_malformed_json_is_a_format_error() -> None:
    with pytest.raises(TraceFormatError):
        summarize_trace(b'{"traceEvents": [{"ph": "X", "ts": 1,}')


def test_truncated_gzip_is_a_format_error(kineto_dir: Path) -> None:
    data = (kineto_dir / "hta/trace_filter/sampled_rank-0.json.gz").read_bytes()
    with pytest.raises(TraceFormatError):
        summarize_trace(data[: len(data) // 2])


@pytest.mark.parametrize("doc", [b'{"schemaVersion": 1}', b"[1, 2]", b"", b"null"])
def test_no_trace_events_is_a_format_error(doc: bytes) -> None:
    with pytest.raises(TraceFormatError):
        summarize_trace(doc)


def test_decompressed_size_limit(kineto_dir: Path) -> None:
    path = kineto_dir / "hta/trace_filter/sampled_rank-0.json.gz"
    with pytest.raises(TraceTooLargeError) as info:
        summarize_trace(path, max_bytes=1_000_000)
    assert not isinstance(info.value, TraceFormatError)
    bomb = gzip.compress(b'{"traceEvents": [' + b" " * 50_000_000 + b"]}")
    assert len(bomb) < 100_000
    with pytest.raises(TraceTooLargeError):
        summarize_trace(bomb, max_bytes=10_000_000)
    assert summarize_trace(path, max_bytes=50_000_000).trace_bytes < 50_000_000


def test_read_header_stops_at_trace_events(kineto_dir: Path) -> None:
    with reader.open_trace(kineto_dir / NCCL) as stream:
        header, found = reader.read_header(stream)
    assert found and header["distributedInfo"]["rank"] == 0
    assert "traceEvents" not in header and "traceName" not in header  # traceName is written after the events


# ----------------------------------------------------------------------------------- several ranks


def test_eight_rank_dlrm_job_combines_into_one(dlrm_dir: Path) -> None:
    summaries = [summarize_trace(p) for p in sorted(dlrm_dir.glob("*.json"))]
    job = combine_ranks(summaries)
    assert job["world_size"] == 8 and job["ranks_present"] == 8 and job["missing_ranks"] == []
    assert [r["rank"] for r in job["per_rank"]] == list(range(8))
    t = job["totals"]
    assert t["span_us"] == pytest.approx(sum(s.gpu_time.span_us for s in summaries if s.gpu_time))
    assert t["idle_pct"] + t["compute_pct"] + t["non_compute_pct"] == pytest.approx(100)
    assert t["communication_us"] > 0  # NCCL all-to-all / all-reduce on every rank
    straggler = job["straggler"]
    assert straggler is not None
    slowest = max(job["per_rank"], key=lambda r: r["step_time_mean_us"])
    assert straggler["rank"] == slowest["rank"] and straggler["slowdown_fraction"] >= 0
    json.dumps(job, allow_nan=False)
    with pytest.raises(ValueError, match="rank 0"):
        combine_ranks([summaries[0], summaries[0]])
