"""A stored `fleetprof.snapshot.v1` document back in the structure `torch.cuda.memory._snapshot()` returns, so that
the pickle of it is what `torch.cuda.memory._dump_snapshot` writes and PyTorch's memory_viz (pytorch.org/memory_viz,
`torch.cuda._memory_viz`) opens.

What torch's readers use, and what this gives them (torch/cuda/_memory_viz.py, 2.13):
- `segments[]`: device, address, total_size, stream, segment_type, segment_pool_id, is_expandable, allocated_size,
  active_size, requested_size, frames, `blocks[]` {address, size, requested_size, state, frames}; `segsum` checks
  that each segment's blocks add up to it (active blocks by their requested size plus the rounding);
- `device_traces[device][]`: {action, addr, size, stream, time_us, frames}, per device in allocator order.
What the conversion to JSON dropped stays dropped: stack frames are empty lists (the viewers show `<non-python>`),
an unknown requested size is the block's size, an unknown event address 0, an out-of-memory event's unknown
`device_free` 0 (torch's readers need numbers there).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

ACTIVE = ("active_allocated", "active_pending_free")


def _block(b: Mapping[str, Any]) -> dict[str, Any]:
    size = int(b["size_bytes"])
    state = str(b["state"])
    requested = b.get("requested_size_bytes")
    if state == "inactive":
        requested = 0  # torch writes 0 for a free block
    elif requested is None:
        requested = size  # unknown: no internal fragmentation claimed
    return {"address": int(b["address"]), "size": size, "requested_size": int(requested), "state": state,
            "frames": []}


def _segment(seg: Mapping[str, Any]) -> dict[str, Any]:
    blocks = [_block(b) for b in seg.get("blocks") or []]
    pool = seg.get("segment_pool_id")
    return {
        "device": int(seg.get("device") or 0),
        "address": int(seg["address"]),
        "total_size": int(seg["total_size_bytes"]),
        "allocated_size": sum(b["size"] for b in blocks if b["state"] == "active_allocated"),
        "active_size": sum(b["size"] for b in blocks if b["state"] in ACTIVE),
        "requested_size": sum(b["requested_size"] for b in blocks if b["state"] == "active_allocated"),
        "stream": int(seg.get("stream") or 0),
        "segment_type": seg.get("segment_type") or "large",
        "segment_pool_id": tuple(pool) if isinstance(pool, list) and len(pool) == 2 else (0, 0),
        "is_expandable": bool(seg.get("is_expandable") or False),
        "frames": [],
        "blocks": blocks,
    }


def to_torch_snapshot(doc: Mapping[str, Any]) -> dict[str, Any]:
    """`fleetprof.snapshot.v1` (validated on upload) -> the dict `torch.cuda.memory._snapshot()` returns."""
    segments = [_segment(s) for s in doc.get("segments") or []]
    events = doc.get("events") or []
    devices = 1 + max([s["device"] for s in segments] + [int(e.get("device") or 0) for e in events] + [0])
    traces: list[list[dict[str, Any]]] = [[] for _ in range(devices)]
    for e in events:
        entry = {
            "action": str(e["action"]),
            "addr": int(e["addr"]) if e.get("addr") is not None else 0,
            "size": int(e.get("size_bytes") or 0),
            "stream": int(e.get("stream") or 0),
            "time_us": int(e.get("time_us") or 0),
            "frames": [],
        }
        if entry["action"] == "oom":
            # memory_viz's trace() reads it; 0 where the conversion did not keep it (snapshots converted before it did)
            entry["device_free"] = int(e.get("device_free_bytes") or 0)
        traces[int(e.get("device") or 0)].append(entry)
    return {"segments": segments, "device_traces": traces, "allocator_settings": {}, "external_annotations": []}
