"""Fragmentation and allocator events from an uploaded CUDA memory snapshot (`fleetprof.snapshot.v1` JSON).

The client converts torch's snapshot pickle (fleetprof/snapshot.py); here we validate the JSON and never
unpickle. Per device:
- reserved = bytes in segments (cudaMalloc'd by the caching allocator);
- allocated = bytes in `active_allocated` blocks; active adds blocks awaiting a cross-stream free;
- internal fragmentation = block size - requested size over allocated blocks whose requested size is
  known, split into the 512-byte rounding (`kMinBlockSize`) and the unsplit remainder (a block the
  allocator did not split because the rest was too small to be worth a block);
- external fragmentation = inactive blocks in segments that still hold active blocks: free bytes
  that cannot be returned by `empty_cache()` and only serve requests that fit the gaps; inactive
  whole segments are `cached_free_bytes` (releasable);
- largest free block = the biggest single request served without a new cudaMalloc.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

SNAPSHOT_FORMAT = "fleetprof.snapshot.v1"
ALLOCATOR_ROUND_BYTES = 512  # CUDACachingAllocator kMinBlockSize: every request is rounded up to it
BLOCK_STATES = frozenset({"active_allocated", "active_pending_free", "inactive"})
ACTIONS = frozenset(
    {"alloc", "free_requested", "free_completed", "segment_alloc", "segment_free", "segment_map",
     "segment_unmap", "oom", "snapshot"}
)
MAX_ITEMS = 5_000_000  # segments + blocks + events; the upload size limit bites first


class SnapshotFormatError(ValueError):
    """The document is not a valid `fleetprof.snapshot.v1` snapshot (a 422)."""


@dataclass(frozen=True)
class DeviceMemory:
    device: int
    segments: int
    blocks: int
    reserved_bytes: int
    allocated_bytes: int
    active_bytes: int
    requested_bytes: int | None  # over allocated blocks with a known request
    internal_fragmentation_bytes: int | None
    rounding_bytes: int | None  # part of internal: requests rounded up to 512 bytes
    unsplit_remainder_bytes: int | None  # part of internal: block larger than the rounded request
    blocks_without_requested_size: int
    external_fragmentation_bytes: int  # inactive blocks inside segments still in use
    cached_free_bytes: int  # inactive whole segments (empty_cache() would release them)
    largest_free_block_bytes: int | None
    external_fragmentation_fraction: float | None  # of reserved


@dataclass(frozen=True)
class SnapshotSummary:
    devices: list[DeviceMemory]
    reserved_bytes: int  # largest single device (what must fit on one GPU)
    allocated_bytes: int
    internal_fragmentation_bytes: int | None
    external_fragmentation_bytes: int
    largest_free_block_bytes: int | None
    event_counts: dict[str, int]
    events: list[dict[str, Any]]  # allocator trace: device, action, addr, size_bytes, stream, time_us

    def busiest_device(self) -> int | None:
        """The device with the most allocator events (None without events)."""
        per = Counter(e["device"] for e in self.events)
        return per.most_common(1)[0][0] if per else None

    def allocator_events(self, device: int | None = None) -> list[dict[str, Any]]:
        """The trace in the input format of `alloc_trace.from_allocator_events` (action, addr, size,
        stream, time_us), in allocator order; `device=None` takes the device with the most events."""
        if device is None:
            device = self.busiest_device()
            if device is None:
                return []
        return [
            {"action": e["action"], "addr": e["addr"] if e["addr"] is not None else -1, "size": e["size_bytes"],
             "stream": e["stream"] if e["stream"] is not None else -1, "time_us": e["time_us"]}
            for e in self.events
            if e["device"] == device
        ]

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out.pop("events")  # can be large: served separately, not in the report
        out["events"] = len(self.events)
        return out


def parse_snapshot_json(doc: Mapping[str, Any]) -> SnapshotSummary:
    """Validate a `fleetprof.snapshot.v1` document and summarize it. Pure; raises SnapshotFormatError."""
    if not isinstance(doc, Mapping):
        raise SnapshotFormatError("a snapshot document is a JSON object")
    if doc.get("format") != SNAPSHOT_FORMAT:
        raise SnapshotFormatError(f"format must be {SNAPSHOT_FORMAT!r}, got {doc.get('format')!r}")
    segments = _list(doc.get("segments"), "segments")
    raw_events = _list(doc.get("events", []), "events")
    n_items = len(segments) + len(raw_events)

    per_device: dict[int, list[Mapping[str, Any]]] = {}
    for i, seg in enumerate(segments):
        if not isinstance(seg, Mapping):
            raise SnapshotFormatError(f"segments[{i}] is not an object")
        blocks = _list(seg.get("blocks"), f"segments[{i}].blocks")
        n_items += len(blocks)
        if n_items > MAX_ITEMS:
            raise SnapshotFormatError(f"more than {MAX_ITEMS} segments, blocks and events")
        per_device.setdefault(_nonneg(seg.get("device"), f"segments[{i}].device"), []).append(seg)

    devices = [_device_memory(dev, segs) for dev, segs in sorted(per_device.items())]
    events = [_event(i, e) for i, e in enumerate(raw_events)]
    internal = [d.internal_fragmentation_bytes for d in devices if d.internal_fragmentation_bytes is not None]
    free_blocks = [d.largest_free_block_bytes for d in devices if d.largest_free_block_bytes is not None]
    return SnapshotSummary(
        devices=devices,
        reserved_bytes=max((d.reserved_bytes for d in devices), default=0),
        allocated_bytes=max((d.allocated_bytes for d in devices), default=0),
        internal_fragmentation_bytes=max(internal) if internal else None,
        external_fragmentation_bytes=max((d.external_fragmentation_bytes for d in devices), default=0),
        largest_free_block_bytes=max(free_blocks) if free_blocks else None,
        event_counts=dict(Counter(e["action"] for e in events)),
        events=events,
    )


def _device_memory(device: int, segments: list[Mapping[str, Any]]) -> DeviceMemory:
    reserved = allocated = active = requested = internal = rounding = 0
    external = cached_free = n_blocks = unknown_request = 0
    known_request = False
    largest_free: int | None = None
    for si, seg in enumerate(segments):
        where = f"device {device} segment {si}"
        total = _nonneg(seg.get("total_size_bytes"), f"{where} total_size_bytes")
        blocks = seg["blocks"]
        block_sum = 0
        in_use = False
        free_here = 0
        for bi, b in enumerate(blocks):
            if not isinstance(b, Mapping):
                raise SnapshotFormatError(f"{where} block {bi} is not an object")
            size = _nonneg(b.get("size_bytes"), f"{where} block {bi} size_bytes")
            state = b.get("state")
            if state not in BLOCK_STATES:
                raise SnapshotFormatError(f"{where} block {bi}: unknown state {state!r}")
            block_sum += size
            n_blocks += 1
            if state == "inactive":
                free_here += size
                largest_free = size if largest_free is None else max(largest_free, size)
                continue
            in_use = True
            active += size
            if state != "active_allocated":
                continue
            allocated += size
            req = b.get("requested_size_bytes")
            if req is None:
                unknown_request += 1
                continue
            req = _nonneg(req, f"{where} block {bi} requested_size_bytes")
            if req > size:
                raise SnapshotFormatError(f"{where} block {bi}: requested {req} > block size {size}")
            known_request = True
            requested += req
            internal += size - req
            rounded = -(-req // ALLOCATOR_ROUND_BYTES) * ALLOCATOR_ROUND_BYTES if req else 0
            rounding += min(rounded, size) - req
        if block_sum > total:
            raise SnapshotFormatError(f"{where}: blocks hold {block_sum} bytes, segment only {total}")
        reserved += total
        if in_use:
            external += free_here
        else:
            cached_free += free_here
    return DeviceMemory(
        device=device,
        segments=len(segments),
        blocks=n_blocks,
        reserved_bytes=reserved,
        allocated_bytes=allocated,
        active_bytes=active,
        requested_bytes=requested if known_request else None,
        internal_fragmentation_bytes=internal if known_request else None,
        rounding_bytes=rounding if known_request else None,
        unsplit_remainder_bytes=internal - rounding if known_request else None,
        blocks_without_requested_size=unknown_request,
        external_fragmentation_bytes=external,
        cached_free_bytes=cached_free,
        largest_free_block_bytes=largest_free,
        external_fragmentation_fraction=external / reserved if reserved else None,
    )


def _event(i: int, e: Any) -> dict[str, Any]:
    if not isinstance(e, Mapping):
        raise SnapshotFormatError(f"events[{i}] is not an object")
    action = e.get("action")
    if action not in ACTIONS:
        raise SnapshotFormatError(f"events[{i}]: unknown action {action!r}")
    return {
        "device": _nonneg(e.get("device"), f"events[{i}].device"),
        "action": action,
        "addr": _opt_int(e.get("addr"), f"events[{i}].addr"),
        "size_bytes": _nonneg(e.get("size_bytes"), f"events[{i}].size_bytes"),
        "stream": _opt_int(e.get("stream"), f"events[{i}].stream"),
        "time_us": _opt_int(e.get("time_us"), f"events[{i}].time_us"),
    }


def _list(value: Any, what: str) -> list[Any]:
    if not isinstance(value, list):
        raise SnapshotFormatError(f"{what} must be a list")
    return value


def _nonneg(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise SnapshotFormatError(f"{what} must be a non-negative integer, got {value!r}")
    return value


def _opt_int(value: Any, what: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise SnapshotFormatError(f"{what} must be an integer or null, got {value!r}")
    return value
