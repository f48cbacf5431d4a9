from __future__ import annotations

import gzip
import json

import numpy as np
import pytest

from server.analysis.traces.alloc_trace import (
    from_allocator_events,
    from_kineto,
    from_triples,
    live_bytes_curve,
    max_live_bytes,
    synthetic_training_trace,
)


def _mem(ts: float, idx: int, addr: int, nbytes: int, total: int, dev: int = 0) -> dict:
    return {
        "ph": "i", "name": "[memory]", "ts": ts, "pid": 1, "tid": 1,
        "args": {"Ev Idx": idx, "Device Type": 1, "Device Id": dev, "Addr": addr, "Bytes": nbytes,
                 "Total Allocated": total, "Total Reserved": 4096},
    }


def test_kineto_pairs_by_address_and_counts_untracked_bytes() -> None:
    # 1000 bytes live before the window: block at 0x10 (600) is freed in it, 400 never appear
    events = [
        _mem(1.0, 1, 0x20, 512, 1512),
        _mem(2.0, 2, 0x10, -600, 912),
        _mem(3.0, 3, 0x20, -512, 400),
        _mem(4.0, 4, 0x30, 1024, 1424),
        _mem(4.5, 5, 0x99, 8, 8, dev=1),  # another device: ignored when device 0 has more events
    ]
    raw = gzip.compress(json.dumps({"traceEvents": events}).encode())
    tr = from_kineto(raw)
    assert tr.device == "cuda:0" and len(tr) == 3
    by_addr = {int(a): i for i, a in enumerate(tr.addr)}
    pre = by_addr[0x10]
    assert tr.alloc_seq[pre] == -1 and tr.size_bytes[pre] == 600 and tr.free_seq[pre] == 1
    assert not tr.freed[by_addr[0x30]] and tr.free_t[by_addr[0x30]] == 4.0
    assert tr.untracked_live_bytes == 400
    assert tr.observed_reserved_bytes == 4096 and tr.observed_allocated_bytes == 1512
    assert max_live_bytes(tr) == 600 + 512


def test_real_kineto_trace_agrees_with_total_allocated(real_traces) -> None:
    for name, tr in real_traces.items():
        # bytes in the trace + bytes never in it = the allocator's own peak
        assert tr.untracked_live_bytes is not None, name
        assert max_live_bytes(tr) + tr.untracked_live_bytes == tr.observed_allocated_bytes, name
        assert np.all(tr.free_seq > tr.alloc_seq), name
    assert len(real_traces["v100_ddp"]) == 13385


def test_allocator_events_and_segments() -> None:
    events = [
        {"action": "segment_alloc", "addr": 0, "size": 2 << 20, "stream": 0, "time_us": 0},
        {"action": "alloc", "addr": 0, "size": 1024, "stream": 0, "time_us": 1},
        {"action": "alloc", "addr": 1024, "size": 512, "stream": 7, "time_us": 2},
        {"action": "free_requested", "addr": 0, "size": 1024, "stream": 0, "time_us": 3},
        {"action": "free_completed", "addr": 0, "size": 1024, "stream": 0, "time_us": 4},
    ]
    tr = from_allocator_events(events)
    assert len(tr) == 2 and tr.observed_reserved_bytes == 2 << 20
    assert list(tr.stream) == [0, 7]
    assert tr.freed.tolist() == [True, False]
    assert max_live_bytes(tr) == 1536


def test_triples_half_open_and_never_freed() -> None:
    tr = from_triples([(100, 0, 5), (200, 5, 9), (300, 2, None), (50, 7, 7)])
    # [0,5) and [5,9) do not overlap; the zero-length block still counts at its instant
    assert max_live_bytes(tr) == 300 + 200 + 50
    assert not tr.freed[2]
    seq, live = live_bytes_curve(tr)
    assert live[seq < tr.n_events][-1] == 300  # only the never-freed block is left before the end
    with pytest.raises(ValueError):
        from_triples([(1, 5, 4)])


def test_synthetic_trace_shape() -> None:
    tr = synthetic_training_trace(5000, seed=3)
    assert len(tr) == 5000 and np.all(tr.size_bytes % 512 == 0)
