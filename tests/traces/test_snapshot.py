"""CUDA memory snapshots: pickle -> JSON on the client (fleetprof.snapshot), JSON -> fragmentation on the server.

No GPU here, so two sources stand in for `torch.cuda.memory._dump_snapshot`:
- a dict in the exact structure torch's allocator writes (torch/cuda/memory.py `_snapshot` docstring:
  segments with address/total_size/stream/segment_type/segment_pool_id tuple/blocks with
  size/requested_size/address/state/frames; device_traces with action/addr/size/stream/time_us/frames,
  an `oom` entry without addr), with sizes chosen so every fragmentation figure is known by hand;
- a real one torch builds on this CPU from a profiled training step (`torch.cuda._memory_viz.
  _profile_to_snapshot`, same format, CPU memory standing in for device 0).
"""

from __future__ import annotations

import json
import pickle
from pathlib import Path
from typing import Any

import pytest

from fleetprof.snapshot import SnapshotFormatError as ClientFormatError
from fleetprof.snapshot import snapshot_to_json
from server.analysis.traces.snapshot import SnapshotFormatError, parse_snapshot_json

MiB = 1 << 20
BASE = 0x7F3A_0000_0000


def _frames() -> list[dict[str, Any]]:
    return [{"filename": "/home/u/train.py", "line": 42, "name": "forward"}]


def _block(addr: int, size: int, state: str, requested: int | None = None) -> dict[str, Any]:
    b: dict[str, Any] = {"address": addr, "size": size, "state": state, "frames": _frames() if state != "inactive" else []}
    b["requested_size"] = requested if requested is not None else 0
    return b


def torch_like_snapshot() -> dict[str, Any]:
    a, b, c = BASE, BASE + 32 * MiB, BASE + 64 * MiB
    seg_a_blocks = [
        _block(a, 4 * MiB, "active_allocated", 4 * MiB - 100),  # 100 bytes of 512-rounding
        _block(a + 4 * MiB, 2 * MiB, "inactive"),
        _block(a + 6 * MiB, 9 * MiB, "active_allocated", 8 * MiB),  # 1 MiB left unsplit
        _block(a + 15 * MiB, 1 * MiB, "active_pending_free", 1 * MiB),
        _block(a + 16 * MiB, 4 * MiB, "inactive"),
    ]
    segments = [
        {"device": 0, "address": a, "total_size": 20 * MiB, "stream": 0, "segment_type": "large",
         "segment_pool_id": (0, 0), "allocated_size": 13 * MiB, "active_size": 14 * MiB,
         "requested_size": 12 * MiB - 100, "is_expandable": False, "frames": [], "blocks": seg_a_blocks},
        {"device": 0, "address": b, "total_size": 2 * MiB, "stream": 0, "segment_type": "small",
         "segment_pool_id": (0, 0), "allocated_size": 0, "active_size": 0, "requested_size": 0,
         "is_expandable": False, "frames": [], "blocks": [_block(b, 2 * MiB, "inactive")]},
        {"device": 0, "address": c, "total_size": 2 * MiB, "stream": 0, "segment_type": "small",
         "segment_pool_id": (0, 0), "allocated_size": 512, "active_size": 512, "requested_size": 1,
         "is_expandable": False, "frames": [],
         "blocks": [_block(c, 512, "active_allocated", 1), _block(c + 512, 2 * MiB - 512, "inactive")]},
    ]
    t = 1_700_000_000_000_000
    trace = [
        {"action": "segment_alloc", "addr": a, "size": 20 * MiB, "stream": 0, "time_us": t, "frames": _frames()},
        {"action": "alloc", "addr": a, "size": 4 * MiB, "stream": 0, "time_us": t + 1, "frames": _frames()},
        {"action": "alloc", "addr": a + 4 * MiB, "size": 2 * MiB, "stream": 0, "time_us": t + 2, "frames": _frames()},
        {"action": "free_requested", "addr": a + 4 * MiB, "size": 2 * MiB, "stream": 0, "time_us": t + 3, "frames": []},
        {"action": "free_completed", "addr": a + 4 * MiB, "size": 2 * MiB, "stream": 0, "time_us": t + 3, "frames": []},
        {"action": "alloc", "addr": a + 6 * MiB, "size": 9 * MiB, "stream": 0, "time_us": t + 4, "frames": _frames()},
        {"action": "oom", "size": 64 * MiB, "stream": 0, "device_free": 3 * MiB, "time_us": t + 5, "frames": []},
    ]
    return {"segments": segments, "device_traces": [trace],
            "allocator_settings": {"PYTORCH_CUDA_ALLOC_CONF": "", "max_split_size": -1}}


def test_client_converts_dict_bytes_and_path_alike(tmp_path: Path) -> None:
    snap = torch_like_snapshot()
    path = tmp_path / "dump_snapshot.pickle"
    path.write_bytes(pickle.dumps(snap))
    docs = [snapshot_to_json(snap), snapshot_to_json(pickle.dumps(snap)), snapshot_to_json(path)]
    assert docs[0] == docs[1] == docs[2]
    doc = json.loads(json.dumps(docs[0], allow_nan=False))
    assert doc["format"] == "fleetprof.snapshot.v1"
    assert "frames" not in json.dumps(doc["segments"]) and "train.py" not in json.dumps(doc)
    assert [e["action"] for e in doc["events"]][-1] == "oom" and doc["events"][-1]["addr"] is None
    assert doc["segments"][0]["segment_pool_id"] == [0, 0]


def test_fragmentation_figures() -> None:
    s = parse_snapshot_json(snapshot_to_json(torch_like_snapshot()))
    (d,) = s.devices
    assert d.reserved_bytes == 24 * MiB
    assert d.allocated_bytes == 13 * MiB + 512
    assert d.active_bytes == 14 * MiB + 512
    assert d.internal_fragmentation_bytes == 100 + MiB + 511
    assert d.rounding_bytes == 100 + 511
    assert d.unsplit_remainder_bytes == MiB
    assert d.external_fragmentation_bytes == 2 * MiB + 4 * MiB + (2 * MiB - 512)
    assert d.cached_free_bytes == 2 * MiB
    assert d.largest_free_block_bytes == 4 * MiB
    assert d.external_fragmentation_fraction == pytest.approx((8 * MiB - 512) / (24 * MiB))
    assert s.event_counts == {"segment_alloc": 1, "alloc": 3, "free_requested": 1, "free_completed": 1, "oom": 1}
    json.dumps(s.to_dict(), allow_nan=False)


def test_allocator_events_feed_the_packing_engine() -> None:
    from server.analysis.traces.alloc_trace import from_allocator_events

    s = parse_snapshot_json(snapshot_to_json(torch_like_snapshot()))
    events = s.allocator_events()
    assert [e["action"] for e in events][:2] == ["segment_alloc", "alloc"]
    trace = from_allocator_events(events)
    assert len(trace) == 3  # three allocations, one freed in the trace
    assert sorted(trace.size_bytes.tolist()) == [2 * MiB, 4 * MiB, 9 * MiB]


def test_real_snapshot_torch_builds_on_this_cpu() -> None:
    torch = pytest.importorskip("torch")
    from torch.cuda._memory_viz import _profile_to_snapshot

    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(64, 256)
    with torch.profiler.profile(
        activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True, record_shapes=True, with_stack=True
    ) as prof:
        for _ in range(2):
            model(x).sum().backward()
            opt.step()
            opt.zero_grad()
    snap = _profile_to_snapshot(prof)
    doc = snapshot_to_json(pickle.dumps(snap))
    s = parse_snapshot_json(json.loads(json.dumps(doc)))
    counts = s.event_counts
    assert counts["alloc"] > 0 and counts["free_requested"] == counts["free_completed"]
    # the 64x512 float activation of the first Linear is among the allocations
    assert 64 * 512 * 4 in {e["size_bytes"] for e in s.events if e["action"] == "alloc"}
    (d,) = s.devices
    params_bytes = sum(p.numel() * 4 for p in model.parameters())
    assert d.allocated_bytes >= params_bytes  # weights (and grads/momentum) are live at the end
    assert d.internal_fragmentation_bytes == 0  # torch fills requested_size = size here
    assert d.allocated_bytes + d.external_fragmentation_bytes + d.cached_free_bytes == d.reserved_bytes


def test_client_refuses_pickles_with_globals(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"

    class Exploit:
        def __reduce__(self) -> tuple[Any, ...]:
            return (open, (str(marker), "w"))

    with pytest.raises(ClientFormatError, match="refused"):
        snapshot_to_json(pickle.dumps({"segments": [], "device_traces": [], "x": Exploit()}))
    assert not marker.exists()
    with pytest.raises(ClientFormatError):
        snapshot_to_json(b"not a pickle")
    with pytest.raises(ClientFormatError):
        snapshot_to_json(pickle.dumps([1, 2]))


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda d: d.update(format="other"), "format"),
        (lambda d: d.__setitem__("segments", {}), "segments"),
        (lambda d: d["segments"][0]["blocks"][0].update(size_bytes=-1), "non-negative"),
        (lambda d: d["segments"][0]["blocks"][0].update(state="weird"), "state"),
        (lambda d: d["segments"][0]["blocks"][0].update(requested_size_bytes=10**12), "requested"),
        (lambda d: d["segments"][0].update(total_size_bytes=1), "blocks hold"),
        (lambda d: d["events"][0].update(action="exec"), "action"),
        (lambda d: d["events"][0].update(size_bytes=1.5), "size_bytes"),
    ],
)
def test_server_rejects_invalid_documents(mutate: Any, message: str) -> None:
    doc = json.loads(json.dumps(snapshot_to_json(torch_like_snapshot())))
    mutate(doc)
    with pytest.raises(SnapshotFormatError, match=message):
        parse_snapshot_json(doc)
    assert issubclass(SnapshotFormatError, ValueError)


def test_server_side_imports_no_unpickler() -> None:
    import ast

    import server.analysis.traces.kineto
    import server.analysis.traces.reader
    import server.analysis.traces.snapshot

    banned = {"pickle", "cPickle", "_pickle", "dill", "joblib", "marshal", "shelve", "torch"}
    for mod in (server.analysis.traces.snapshot, server.analysis.traces.kineto, server.analysis.traces.reader):
        tree = ast.parse(Path(mod.__file__).read_text())
        imported = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        imported |= {(n.module or "").split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
        assert not imported & banned, (mod.__name__, imported & banned)
