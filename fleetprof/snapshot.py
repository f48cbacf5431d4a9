"""CUDA memory snapshots (`torch.cuda.memory._dump_snapshot` pickles) to fleetprof's JSON, on the client.

The server never unpickles: the agent (or `fleetprof import-trace`) converts here and uploads JSON.
Even here the pickle is read with an unpickler that refuses every global, so a hostile file cannot run
code: a snapshot is plain dicts, lists, tuples, strings and numbers, which pickle stores without globals.

Output schema `fleetprof.snapshot.v1` (read by `server.analysis.traces.snapshot.parse_snapshot_json`):

    {"format": "fleetprof.snapshot.v1",
     "segments": [{"device": int, "address": int, "total_size_bytes": int, "stream": int,
                   "segment_type": "small"|"large"|null, "segment_pool_id": [int, int]|null,
                   "is_expandable": bool|null,
                   "blocks": [{"address": int, "size_bytes": int,
                               "requested_size_bytes": int|null,   # before the allocator rounded it
                               "state": "active_allocated"|"active_pending_free"|"inactive"}]}],
     "events": [{"device": int, "action": str, "addr": int|null, "size_bytes": int,
                 "stream": int|null, "time_us": int|null,
                 "device_free_bytes": int|null}],   # oom events only; per device, in allocator order
     "dropped": {"frames": bool, "unknown_actions": int}}

`events` are torch's `device_traces` flattened (actions alloc, free_requested, free_completed,
segment_alloc, segment_free, segment_map, segment_unmap, oom, snapshot). Stack frames are dropped
(file paths, size); block addresses, when torch leaves them out, are rebuilt from the segment layout.
"""

from __future__ import annotations

import io
import pickle
from collections.abc import Mapping
from pathlib import Path
from typing import Any

SNAPSHOT_FORMAT = "fleetprof.snapshot.v1"
BLOCK_STATES = frozenset({"active_allocated", "active_pending_free", "active_awaiting_free", "inactive"})
ACTIONS = frozenset(
    {"alloc", "free_requested", "free_completed", "segment_alloc", "segment_free", "segment_map",
     "segment_unmap", "oom", "snapshot"}
)
MAX_PICKLE_BYTES = 2 << 30


class SnapshotFormatError(ValueError):
    """Not a CUDA memory snapshot, or one this converter cannot read."""


class _NoGlobalsUnpickler(pickle.Unpickler):
    """Builds only pickle's own types (dict, list, tuple, str, bytes, int, float, bool, None)."""

    def find_class(self, module: str, name: str) -> Any:
        raise SnapshotFormatError(f"snapshot pickle references {module}.{name}: refused (only plain data)")


def load_snapshot_pickle(data: bytes) -> dict[str, Any]:
    """Unpickle a snapshot without allowing any class or function reference."""
    try:
        obj = _NoGlobalsUnpickler(io.BytesIO(data)).load()
    except SnapshotFormatError:
        raise
    except Exception as exc:  # pickle raises many types on corrupt input
        raise SnapshotFormatError(f"unreadable snapshot pickle: {exc.__class__.__name__}: {exc}") from exc
    if not isinstance(obj, dict):
        raise SnapshotFormatError(f"a snapshot is a dict, got {type(obj).__name__}")
    return obj


def snapshot_to_json(
    source: Mapping[str, Any] | str | Path | bytes, *, max_pickle_bytes: int = MAX_PICKLE_BYTES
) -> dict[str, Any]:
    """Convert a snapshot (the dict from `torch.cuda.memory._snapshot()`, or its pickle as a path or
    bytes) to the `fleetprof.snapshot.v1` JSON document."""
    if isinstance(source, Mapping):
        snap: Mapping[str, Any] = source
    else:
        if isinstance(source, (str, Path)):
            path = Path(source)
            if path.stat().st_size > max_pickle_bytes:
                raise SnapshotFormatError(f"snapshot larger than {max_pickle_bytes} bytes")
            data = path.read_bytes()
        else:
            data = bytes(source)
        snap = load_snapshot_pickle(data)
    if not isinstance(snap.get("segments"), list):
        raise SnapshotFormatError("snapshot has no `segments` list")
    traces = snap.get("device_traces", [])
    if not isinstance(traces, list):
        raise SnapshotFormatError("`device_traces` is not a list")

    segments = [_segment(seg) for seg in snap["segments"]]
    events: list[dict[str, Any]] = []
    unknown = 0
    for device, trace in enumerate(traces):
        if not isinstance(trace, list):
            raise SnapshotFormatError(f"device_traces[{device}] is not a list")
        for entry in trace:
            if not isinstance(entry, Mapping) or entry.get("action") not in ACTIONS:
                unknown += 1
                continue
            event = {
                "device": device,
                "action": entry["action"],
                "addr": _int_or_none(entry.get("addr")),
                "size_bytes": _int(entry.get("size", 0), "trace size"),
                "stream": _int_or_none(entry.get("stream")),
                "time_us": _int_or_none(entry.get("time_us")),
            }
            if entry["action"] == "oom":  # what the device had free when the allocation failed (memory_viz shows it)
                event["device_free_bytes"] = _int_or_none(entry.get("device_free"))
            events.append(event)
    return {
        "format": SNAPSHOT_FORMAT,
        "segments": segments,
        "events": events,
        "dropped": {"frames": True, "unknown_actions": unknown},
    }


def _segment(seg: Any) -> dict[str, Any]:
    if not isinstance(seg, Mapping) or not isinstance(seg.get("blocks"), list):
        raise SnapshotFormatError("a segment is a dict with a `blocks` list")
    address = _int(seg.get("address", 0), "segment address")
    blocks = []
    offset = address
    for b in seg["blocks"]:
        if not isinstance(b, Mapping):
            raise SnapshotFormatError("a block is a dict")
        size = _int(b.get("size"), "block size")
        state = b.get("state")
        if state not in BLOCK_STATES:
            raise SnapshotFormatError(f"unknown block state {state!r}")
        requested = _int_or_none(b.get("requested_size"))
        if requested is None and isinstance(b.get("history"), list) and b["history"]:
            requested = _int_or_none(b["history"][0].get("real_size"))  # pre-2.1 snapshots
        blocks.append(
            {
                # blocks tile their segment in address order; older snapshots omit the address
                "address": _int(b.get("address", offset), "block address"),
                "size_bytes": size,
                "requested_size_bytes": requested if state != "inactive" else None,
                "state": "active_pending_free" if state == "active_awaiting_free" else state,
            }
        )
        offset += size
    pool = seg.get("segment_pool_id")
    return {
        "device": _int(seg.get("device", 0), "segment device"),
        "address": address,
        "total_size_bytes": _int(seg.get("total_size", offset - address), "segment size"),
        "stream": _int_or_none(seg.get("stream")),
        "segment_type": seg.get("segment_type") if seg.get("segment_type") in ("small", "large") else None,
        "segment_pool_id": [int(p) for p in pool] if isinstance(pool, (list, tuple)) and len(pool) == 2 else None,
        "is_expandable": bool(seg["is_expandable"]) if "is_expandable" in seg else None,
        "blocks": blocks,
    }


def _int(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise SnapshotFormatError(f"{what} is not an integer: {value!r}")
    return value


def _int_or_none(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None
