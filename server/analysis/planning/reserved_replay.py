"""The caching-allocator simulation checked against real traces: reserved memory, simulated vs recorded.

A Kineto trace recorded with `profile_memory=True` carries one `[memory]` event per allocation and free:
`Addr`, `Bytes` (+ allocates, - frees), and the allocator's `Total Allocated` / `Total Reserved` after it.
We replay that sequence through `CachingAllocatorSim` and compare its reserved bytes with the recorded ones.

What lies outside the traced window, and how it is modelled:
- Blocks allocated before tracing began and still live: the first event's `Total Allocated - Bytes`. Those freed
  inside the window (a free of an address the window never allocated) become live blocks of their own size; the
  rest, whose sizes the trace does not give, one live block.
- The cache the earlier steps left. Two models, both reported:
  *cold*: the replay starts from an empty cache, as the estimator's own replay does;
  *seeded*: the replay starts from the segments the window's own addresses reveal. Every address the window
  allocates at lies in a segment that existed (the recorded reserved never moves in these traces); small-pool
  blocks (<= 1 MiB) lie in 2 MiB segments; large ones in segments made of 2 MiB-aligned chunks (cudaMalloc'd
  segments are multiples of 2 MiB on 2 MiB boundaries), cut at every boundary no block straddles: the finest
  segmentation the addresses allow. Merging touching runs instead (the coarsest) let the simulation split a
  free run across what were two real segments and place blocks where the real allocator could not: on the
  timesformer trace it then needed a third 1802 MiB segment (+41 %); the finest needs none (-0.1 %).
  The pre-window blocks get segments of their own, also where in reality they share one with the window's
  blocks; the seeded figure can run high by that much.
- Streams: the events carry none. Blocks used by a second stream (NCCL) come back later than their free says;
  that would show as the seeded replay needing new segments.
`window_touched_bytes` (the union of the window's block intervals) is independent of the simulation: with the
pre-window live bytes it is a lower bound of reserved memory that the window proves; what the recorded reserved
holds above it is cache the window never touched (left by earlier, larger peaks).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from server.analysis.planning.allocator import K_SMALL_BUFFER, K_SMALL_SIZE, CachingAllocatorSim, round_size
from server.analysis.traces.reader import iter_events, open_trace

KINETO_CUDA_DEVICE_TYPE = 1  # `[memory]` `Device Type`: 0 = CPU, 1 = CUDA
_SEGMENT_ALIGN = K_SMALL_BUFFER  # cudaMalloc'd segments start on 2 MiB boundaries (seen in every trace here)


@dataclass(frozen=True)
class MemoryEvent:
    ts_us: float
    addr: int
    nbytes: int  # > 0 allocates, < 0 frees
    total_allocated_bytes: int
    total_reserved_bytes: int


@dataclass(frozen=True)
class DeviceMemoryEvents:
    device: str  # "cuda:0"
    events: list[MemoryEvent]  # in trace order (ts, then event index)
    inconsistent_events: int  # events whose Total Allocated is not the previous one plus Bytes


@dataclass(frozen=True)
class ReservedReplay:
    """One device of one trace. Bytes; `_pct` relative to the recorded value; error = simulated - recorded."""

    device: str
    events: int
    inconsistent_events: int
    pre_window_allocated_bytes: int
    recorded_peak_allocated_bytes: int
    simulated_peak_allocated_bytes: int
    recorded_peak_reserved_bytes: int
    recorded_reserved_changes: int
    window_touched_bytes: int
    untouched_reserved_bytes: int  # recorded peak reserved - pre-window allocated - window touched
    cold_peak_reserved_bytes: int
    cold_error_pct: float
    cold_mean_abs_error_pct: float  # over the events: |simulated - recorded reserved| / recorded
    seeded_segment_bytes: int
    seeded_new_segment_bytes: int  # what the seeded replay had to add: zero when the real segments sufficed
    seeded_peak_reserved_bytes: int
    seeded_error_pct: float
    seeded_mean_abs_error_pct: float


def read_memory_events(source: str | Path) -> list[DeviceMemoryEvents]:
    """The CUDA `[memory]` events carrying `Addr` and `Total Reserved`, per device (2021 traces carry neither)."""
    rows: dict[int, list[tuple[float, int, MemoryEvent]]] = {}
    with open_trace(source) as stream:
        for ev in iter_events(stream):
            if ev.get("name") != "[memory]":
                continue
            args = ev.get("args") or {}
            if args.get("Device Type") != KINETO_CUDA_DEVICE_TYPE or "Total Reserved" not in args or "Addr" not in args:
                continue
            event = MemoryEvent(float(ev["ts"]), int(args["Addr"]), int(args["Bytes"]),
                                int(args["Total Allocated"]), int(args["Total Reserved"]))
            rows.setdefault(int(args.get("Device Id", 0)), []).append((event.ts_us, int(args.get("Ev Idx", 0)), event))
    out = []
    for device_id, items in sorted(rows.items()):
        items.sort(key=lambda r: (r[0], r[1]))  # `Ev Idx` alone does not follow time in the V100 trace
        events = [e for _, _, e in items]
        bad = sum(1 for a, b in zip(events, events[1:], strict=False)
                  if a.total_allocated_bytes + b.nbytes != b.total_allocated_bytes)
        out.append(DeviceMemoryEvents(f"cuda:{device_id}", events, bad))
    return out


def _keyed(events: list[MemoryEvent]) -> tuple[list[tuple[int, int]], dict[int, int]]:
    """(key, nbytes) per event, an address reused getting a new key; and the blocks freed but never allocated
    in the window (key -> bytes): live before it."""
    live: dict[int, int] = {}
    before: dict[int, int] = {}
    seq: list[tuple[int, int]] = []
    for i, e in enumerate(events):
        if e.nbytes > 0:
            live[e.addr] = i
            seq.append((i, e.nbytes))
        else:
            key = live.pop(e.addr, None)
            if key is None:
                key = -1 - i
                before[key] = -e.nbytes
            seq.append((key, e.nbytes))
    return seq, before


def replay_sequence(events: list[MemoryEvent]) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """What a replay of the window allocates first, (key, bytes): the blocks live before it (those it frees at
    their own sizes, the rest as one block); then the window's (key, nbytes) events."""
    seq, before = _keyed(events)
    first = events[0]
    live = list(before.items())
    rest = first.total_allocated_bytes - first.nbytes - sum(before.values())
    if rest > 0:
        live.append((1 << 62, rest))
    return live, seq


def _touched_segments(events: list[MemoryEvent]) -> tuple[list[tuple[int, bool]], int]:
    """Segments (size, small pool) implied by the window's block addresses, and the bytes the blocks cover."""
    small: set[int] = set()
    large: list[tuple[int, int]] = []
    covered: list[tuple[int, int]] = []
    for e in events:
        if e.nbytes <= 0:
            continue
        size = round_size(e.nbytes)
        covered.append((e.addr, e.addr + size))
        if size <= K_SMALL_SIZE:
            small.add(e.addr // _SEGMENT_ALIGN)
        else:
            start = e.addr // _SEGMENT_ALIGN * _SEGMENT_ALIGN
            end = -(-(e.addr + size) // _SEGMENT_ALIGN) * _SEGMENT_ALIGN
            large.append((start, end))
    segments = [(K_SMALL_BUFFER, True) for _ in small]
    # the finest segmentation the addresses allow: a cut at every 2 MiB boundary no block straddles
    segments += [(end - start, False) for start, end in _merge(large, touching=False)]
    return segments, sum(end - start for start, end in _merge(covered))


def _merge(intervals: Iterable[tuple[int, int]], *, touching: bool = True) -> list[tuple[int, int]]:
    """Union of intervals; `touching=False` keeps intervals that only meet end to start apart."""
    merged: list[list[int]] = []
    for start, end in sorted(intervals):
        if merged and (start <= merged[-1][1] if touching else start < merged[-1][1]):
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return [(s, e) for s, e in merged]


def _run(dev: DeviceMemoryEvents, seed: list[tuple[int, bool]]) -> tuple[CachingAllocatorSim, int, list[int]]:
    """Replay with the pre-window blocks live first: the simulation, its reserved bytes when the window opens,
    and its reserved bytes after each event."""
    sim = CachingAllocatorSim()
    live, seq = replay_sequence(dev.events)
    for key, nbytes in live:
        sim.malloc(key, nbytes)
    for size, small in seed:  # after the live blocks, so that those do not take the window's segments
        sim.seed_segment(size, small)
    opening = sim.reserved
    reserved = []
    for key, nbytes in seq:
        if nbytes > 0:
            sim.malloc(key, nbytes)
        else:
            sim.free(key)
        reserved.append(sim.reserved)
    return sim, opening, reserved


def _pct(simulated: float, recorded: float) -> float:
    return 100.0 * (simulated - recorded) / recorded


def _mean_abs_pct(simulated: list[int], events: list[MemoryEvent]) -> float:
    return 100.0 * sum(abs(s - e.total_reserved_bytes) / e.total_reserved_bytes
                       for s, e in zip(simulated, events, strict=True)) / len(events)


def replay_device(dev: DeviceMemoryEvents) -> ReservedReplay:
    events = dev.events
    first = events[0]
    pre = first.total_allocated_bytes - first.nbytes
    recorded_peak = max(e.total_reserved_bytes for e in events)
    changes = sum(1 for a, b in zip(events, events[1:], strict=False)
                  if a.total_reserved_bytes != b.total_reserved_bytes)
    seed, touched = _touched_segments(events)
    cold, _, cold_series = _run(dev, [])
    seeded, seeded_opening, seeded_series = _run(dev, seed)
    return ReservedReplay(
        device=dev.device,
        events=len(events),
        inconsistent_events=dev.inconsistent_events,
        pre_window_allocated_bytes=pre,
        recorded_peak_allocated_bytes=max(e.total_allocated_bytes for e in events),
        simulated_peak_allocated_bytes=cold.stats.peak_allocated_bytes,
        recorded_peak_reserved_bytes=recorded_peak,
        recorded_reserved_changes=changes,
        window_touched_bytes=touched,
        untouched_reserved_bytes=recorded_peak - pre - touched,
        cold_peak_reserved_bytes=cold.stats.peak_reserved_bytes,
        cold_error_pct=_pct(cold.stats.peak_reserved_bytes, recorded_peak),
        cold_mean_abs_error_pct=_mean_abs_pct(cold_series, events),
        seeded_segment_bytes=sum(size for size, _ in seed),
        seeded_new_segment_bytes=seeded.stats.peak_reserved_bytes - seeded_opening,
        seeded_peak_reserved_bytes=seeded.stats.peak_reserved_bytes,
        seeded_error_pct=_pct(seeded.stats.peak_reserved_bytes, recorded_peak),
        seeded_mean_abs_error_pct=_mean_abs_pct(seeded_series, events),
    )


def replay_trace(source: str | Path) -> list[ReservedReplay]:
    """One result per CUDA device whose `[memory]` events carry `Total Reserved`; [] when none do."""
    return [replay_device(dev) for dev in read_memory_events(source) if dev.events]



_ALLOCATOR_FREES = ("free_completed", "free_requested")


def memory_events_from_allocator(events: Iterable[dict], *, allocated_after_bytes: int | None,
                                 reserved_after_bytes: int | None, device: str = "cuda:0") -> DeviceMemoryEvents:
    """The CUDA caching allocator's own history (`torch.cuda.memory._record_memory_history`, as a
    `fleetprof.snapshot.v1` document's events: action, addr, size, time_us) as the `[memory]` event sequence a
    Kineto trace would carry, so that the same replay and setting comparison run on it.

    A block counts as freed when the allocator could reuse it: at `free_completed` where the history has those
    (a free waits for the streams that used the block), else at `free_requested`. The running totals end at the
    snapshot's own allocated and reserved bytes (`*_after_bytes`, taken when the history was read), which fixes
    what was live and reserved before the window; unknown, the window's unmatched frees are all that was live."""
    events = [e for e in events if e.get("addr") is not None and e["addr"] >= 0]  # -1 / None: no address
    free_action = next((a for a in _ALLOCATOR_FREES if any(e["action"] == a for e in events)), None)
    blocks = [e for e in events if e["action"] == "alloc" or e["action"] == free_action]
    net = sum(e["size"] if e["action"] == "alloc" else -e["size"] for e in blocks)
    seg_net = sum(e["size"] if e["action"] == "segment_alloc" else -e["size"]
                  for e in events if e["action"] in ("segment_alloc", "segment_free"))
    allocated = (allocated_after_bytes - net) if allocated_after_bytes is not None else 0
    reserved = (reserved_after_bytes - seg_net) if reserved_after_bytes is not None else 0
    if allocated_after_bytes is None:  # at least the blocks the window frees without having allocated them
        seen: set[int] = set()
        for e in blocks:
            if e["action"] == "alloc":
                seen.add(e["addr"])
            elif e["addr"] not in seen:
                allocated += e["size"]
            else:
                seen.discard(e["addr"])
    out: list[MemoryEvent] = []
    for e in events:
        if e["action"] in ("segment_alloc", "segment_free"):
            reserved += e["size"] if e["action"] == "segment_alloc" else -e["size"]
            continue
        if e["action"] not in ("alloc", free_action):
            continue
        nbytes = e["size"] if e["action"] == "alloc" else -e["size"]
        allocated += nbytes
        out.append(MemoryEvent(float(e.get("time_us") or 0.0), int(e["addr"]), int(nbytes), allocated,
                               max(reserved, allocated)))
    bad = sum(1 for a, b in zip(out, out[1:], strict=False) if a.total_allocated_bytes + b.nbytes
              != b.total_allocated_bytes)
    return DeviceMemoryEvents(device, out, bad)
