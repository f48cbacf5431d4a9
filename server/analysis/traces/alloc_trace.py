"""Allocation traces: every device allocation as a (size, lifetime, address) row, in numpy arrays.

Three sources build the same `AllocationTrace`:
- Kineto `[memory]` instant events (`Addr`, `Bytes` > 0 alloc, < 0 free), streamed with `traces.reader`;
- the allocator event list the snapshot converter emits from `torch.cuda.memory._record_memory_history`
  (`[{"action": "alloc"|"free", "addr", "size", "stream", "time_us"}]`);
- (size, start, end) triples, the pre-training estimator's own trace.

Lifetimes are half-open `[alloc_seq, free_seq)` over the *event order* (`*_seq`), not over timestamps:
two events can share a microsecond, and only the order says whether a block was freed before the next
was allocated. Timestamps (`alloc_t`, `free_t`, in `time_unit_s` seconds per unit) are kept for the swap
plan, which needs durations.

A profiler window starts mid-job: blocks freed in it but allocated before it get `alloc_seq = -1` and
`alloc_t = start_t`; blocks never freed get `free_seq = n_events` and `free_t = end_t`. Bytes that were live
for the whole window and never touched (weights allocated before profiling began) appear in no event;
`untracked_live_bytes` says how much that was (from `Total Allocated`), so planned peaks can be set next
to `Total Reserved`, which includes them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import numpy as np

from server.analysis.traces.reader import iter_events, open_trace

KINETO_CUDA_DEVICE_TYPE = 1  # Kineto's `Device Type`: 0 = CPU, 1 = CUDA
KINETO_TIME_UNIT_S = 1e-6  # Kineto `ts` is microseconds


@dataclass(frozen=True)
class AllocationTrace:
    size_bytes: np.ndarray  # int64, as the allocator handed them out (already rounded for Kineto)
    alloc_seq: np.ndarray  # int64 position of the alloc event; -1 = before the window
    free_seq: np.ndarray  # int64 position of the free event; n_events = never freed in the window
    alloc_t: np.ndarray  # float64, in time units; start_t when allocated before the window
    free_t: np.ndarray  # float64, in time units; end_t when never freed
    addr: np.ndarray  # int64, -1 unknown
    stream: np.ndarray  # int64, -1 unknown
    time_unit_s: float = KINETO_TIME_UNIT_S
    start_t: float = 0.0
    end_t: float = 0.0
    n_events: int = 0
    source: str = "triples"
    device: str | None = None
    requested_size_bytes: np.ndarray | None = None  # before allocator rounding, where the source knows it
    untracked_live_bytes: int | None = None  # live the whole window, in no event (None: unknown)
    observed_reserved_bytes: int | None = None  # peak `Total Reserved` / segment bytes seen
    observed_allocated_bytes: int | None = None  # peak `Total Allocated` seen
    notes: tuple[str, ...] = field(default=())

    def __len__(self) -> int:
        return int(self.size_bytes.shape[0])

    @property
    def freed(self) -> np.ndarray:
        return self.free_seq < self.n_events

    @property
    def alloc_seen(self) -> np.ndarray:
        return self.alloc_seq >= 0

    def lifetime_s(self) -> np.ndarray:
        return (self.free_t - self.alloc_t) * self.time_unit_s


def max_live_bytes(trace: AllocationTrace, sizes_bytes: np.ndarray | None = None) -> int:
    """Most bytes live at once among the traced allocations: no plan can use less (the lower bound)."""
    return int(live_bytes_curve(trace, sizes_bytes)[1].max(initial=0))


def live_bytes_curve(
    trace: AllocationTrace, sizes_bytes: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """(seq, live bytes just after each event position). Frees at a position count before allocs."""
    sizes = trace.size_bytes if sizes_bytes is None else sizes_bytes
    if len(sizes) == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    seq = np.concatenate([trace.free_seq, trace.alloc_seq])
    delta = np.concatenate([-sizes, sizes]).astype(np.int64)
    kind = np.concatenate([np.zeros(len(sizes), np.int8), np.ones(len(sizes), np.int8)])
    order = np.lexsort((kind, seq))
    live = np.cumsum(delta[order])
    return seq[order], live


# --- builders ---------------------------------------------------------------------------------


def _pair_events(
    seq_t: np.ndarray, addrs: np.ndarray, nbytes: np.ndarray, streams: np.ndarray
) -> tuple[dict[str, np.ndarray], list[str]]:
    """Pair alloc (+bytes) and free (-bytes) events by address, in event order.

    An address allocated twice without a free in between lost its free event: the first block is closed
    at the second alloc (the allocator cannot hand out a live address twice).
    """
    n = len(addrs)
    open_by_addr: dict[int, int] = {}
    size: list[int] = []
    a_seq: list[int] = []
    f_seq: list[int] = []
    addr_out: list[int] = []
    stream_out: list[int] = []
    lost_frees = 0
    addrs_l = addrs.tolist()
    bytes_l = nbytes.tolist()
    streams_l = streams.tolist()
    for i in range(n):
        a = addrs_l[i]
        b = bytes_l[i]
        if b > 0:
            prev = open_by_addr.get(a)
            if prev is not None:
                f_seq[prev] = i
                lost_frees += 1
            open_by_addr[a] = len(size)
            size.append(b)
            a_seq.append(i)
            f_seq.append(n)
            addr_out.append(a)
            stream_out.append(streams_l[i])
        elif b < 0:
            k = open_by_addr.pop(a, None)
            if k is None:  # allocated before the window opened
                size.append(-b)
                a_seq.append(-1)
                f_seq.append(i)
                addr_out.append(a)
                stream_out.append(streams_l[i])
            else:
                f_seq[k] = i
    notes = [f"{lost_frees} allocations had no free event before their address was reused"] if lost_frees else []
    arrays: dict[str, np.ndarray] = {
        "size_bytes": np.asarray(size, np.int64),
        "alloc_seq": np.asarray(a_seq, np.int64),
        "free_seq": np.asarray(f_seq, np.int64),
        "addr": np.asarray(addr_out, np.int64),
        "stream": np.asarray(stream_out, np.int64),
    }
    start_t, end_t = (float(seq_t[0]), float(seq_t[-1])) if n else (0.0, 0.0)
    arrays["alloc_t"] = (np.where(arrays["alloc_seq"] >= 0, seq_t[np.maximum(arrays["alloc_seq"], 0)], start_t)
                         if n else np.zeros(0))
    arrays["free_t"] = (np.where(arrays["free_seq"] < n, seq_t[np.minimum(arrays["free_seq"], n - 1)], end_t)
                        if n else np.zeros(0))
    return arrays, notes


def from_kineto(
    source: str | Path | bytes | IO[bytes],
    *,
    device_id: int | None = None,
    device_type: int = KINETO_CUDA_DEVICE_TYPE,
) -> AllocationTrace:
    """Allocation trace of one device from a Kineto trace's `[memory]` events (streamed).

    `device_id=None` picks the device of `device_type` with the most memory events.
    """
    per_device: dict[int, list[tuple[float, float, int, int, int, int]]] = {}
    with open_trace(source) as stream:
        for ev in iter_events(stream):
            if ev.get("name") != "[memory]":
                continue
            args = ev.get("args") or {}
            if args.get("Device Type") != device_type or "Addr" not in args or "Bytes" not in args:
                continue
            dev = int(args.get("Device Id", -1))
            if device_id is not None and dev != device_id:
                continue
            per_device.setdefault(dev, []).append(
                (
                    float(ev.get("ts", 0.0)),
                    float(args.get("Ev Idx", 0)),
                    int(args["Addr"]),
                    int(args["Bytes"]),
                    int(args.get("Total Allocated", -1)),
                    int(args.get("Total Reserved", -1)),
                )
            )
    if not per_device:
        raise ValueError("no [memory] events with Addr and Bytes for the requested device")
    dev = max(per_device, key=lambda d: len(per_device[d])) if device_id is None else device_id
    rows = per_device[dev]
    ts = np.array([r[0] for r in rows])
    ev_idx = np.array([r[1] for r in rows])
    # Events from several threads interleave in the file and in `Ev Idx`; timestamp order is the one
    # that agrees with the running `Total Allocated` (checked on the HTA V100 trace), Ev Idx breaks ties.
    order = np.lexsort((ev_idx, ts))
    ts = ts[order]
    addrs = np.array([rows[i][2] for i in order], np.int64)
    nbytes = np.array([rows[i][3] for i in order], np.int64)
    total_alloc = np.array([rows[i][4] for i in order], np.int64)
    total_res = np.array([rows[i][5] for i in order], np.int64)
    arrays, notes = _pair_events(ts, addrs, nbytes, np.full(len(addrs), -1, np.int64))
    untracked: int | None = None
    if total_alloc[0] >= 0:
        before_window = int(total_alloc[0] - nbytes[0])
        in_trace = int(arrays["size_bytes"][arrays["alloc_seq"] < 0].sum())
        untracked = before_window - in_trace
        if untracked < 0:
            notes.append(f"Total Allocated is {-untracked} bytes below the traced blocks; untracked set to 0")
            untracked = 0
    reserved = int(total_res.max()) if total_res.max() > 0 else None
    allocated = int(total_alloc.max()) if total_alloc.max() >= 0 else None
    return AllocationTrace(
        **arrays,
        time_unit_s=KINETO_TIME_UNIT_S,
        start_t=float(ts[0]),
        end_t=float(ts[-1]),
        n_events=len(addrs),
        source="kineto",
        device=f"cuda:{dev}" if device_type == KINETO_CUDA_DEVICE_TYPE else f"type{device_type}:{dev}",
        untracked_live_bytes=untracked,
        observed_reserved_bytes=reserved,
        observed_allocated_bytes=allocated,
        notes=tuple(notes),
    )


def from_allocator_events(events: Sequence[Mapping[str, Any]]) -> AllocationTrace:
    """Allocation trace from the snapshot converter's allocator events, in list order.

    Accepts PyTorch's own action names too: `free_completed` (or `free` / `free_requested` when no
    `free_completed` appears) ends a block; `segment_alloc` / `segment_free` give the reserved bytes.
    """
    has_completed = any(e.get("action") == "free_completed" for e in events)
    free_actions = {"free", "free_completed"} if has_completed else {"free", "free_requested"}
    ts: list[float] = []
    addrs: list[int] = []
    nbytes: list[int] = []
    streams: list[int] = []
    reserved = peak_reserved = 0
    saw_segments = False
    for e in events:
        action = e.get("action")
        size = int(e.get("size", 0))
        if action in ("segment_alloc", "segment_map"):
            saw_segments = True
            reserved += size
            peak_reserved = max(peak_reserved, reserved)
            continue
        if action in ("segment_free", "segment_unmap"):
            saw_segments = True
            reserved -= size
            continue
        if action == "alloc":
            sign = 1
        elif action in free_actions:
            sign = -1
        else:
            continue
        if size <= 0:
            continue
        t_us = e.get("time_us")  # null in a snapshot torch built from a profile (_profile_to_snapshot): event order
        ts.append(float(t_us) if t_us is not None else float(len(ts)))
        addrs.append(int(e.get("addr", -1)))
        nbytes.append(sign * size)
        streams.append(int(e.get("stream", -1)))
    if not ts:
        raise ValueError("no alloc/free events")
    t = np.maximum.accumulate(np.asarray(ts))
    arrays, notes = _pair_events(t, np.asarray(addrs, np.int64), np.asarray(nbytes, np.int64),
                                 np.asarray(streams, np.int64))
    return AllocationTrace(
        **arrays,
        time_unit_s=1e-6,
        start_t=float(t[0]),
        end_t=float(t[-1]),
        n_events=len(ts),
        source="allocator_events",
        device=None, untracked_live_bytes=None, observed_allocated_bytes=None,  # unknown from allocator events
        observed_reserved_bytes=peak_reserved if saw_segments else None,
        notes=tuple(notes),
    )


def from_triples(
    triples: Iterable[tuple[int, float, float | None]] | np.ndarray,
    *,
    time_unit_s: float = 1.0,
    requested_size_bytes: np.ndarray | None = None,
) -> AllocationTrace:
    """Allocation trace from (size_bytes, start, end) rows; end None/inf = never freed.

    Lifetimes are half-open: a block ending at t and one starting at t may share memory. A zero-length
    block still occupies its bytes for one instant.
    """
    arr = np.asarray(list(triples) if not isinstance(triples, np.ndarray) else triples, dtype=np.float64)
    arr = arr.reshape(-1, 3) if arr.size else np.zeros((0, 3))
    n = len(arr)
    size = arr[:, 0].astype(np.int64)
    start = arr[:, 1]
    end = arr[:, 2].copy()
    never = ~np.isfinite(end)
    end_t = float(np.nanmax(np.concatenate([start, end[~never]]))) if n else 0.0
    end[never] = end_t
    if np.any(end < start):
        raise ValueError("a block ends before it starts")
    # Event order: by time, frees before allocs at equal times; seq = 2*rank leaves room for zero-length.
    times = np.concatenate([end, start])
    kind = np.concatenate([np.zeros(n, np.int8), np.ones(n, np.int8)])
    order = np.lexsort((kind, times))
    rank = np.empty(2 * n, np.int64)
    rank[order] = np.arange(2 * n)
    free_seq = 2 * rank[:n]
    alloc_seq = 2 * rank[n:]
    zero = free_seq < alloc_seq
    free_seq[zero] = alloc_seq[zero] + 1
    n_events = 4 * n + 2
    free_seq[never] = n_events
    return AllocationTrace(
        size_bytes=size,
        alloc_seq=alloc_seq,
        free_seq=free_seq,
        alloc_t=start,
        free_t=end,
        addr=np.full(n, -1, np.int64),
        stream=np.full(n, -1, np.int64),
        time_unit_s=time_unit_s,
        start_t=float(start.min()) if n else 0.0,
        end_t=end_t,
        n_events=n_events,
        source="triples",
        requested_size_bytes=None if requested_size_bytes is None else np.asarray(requested_size_bytes, np.int64),
    )


def synthetic_training_trace(
    n_allocations: int, *, seed: int = 0, layers: int = 60, weight_fraction: float = 0.05
) -> AllocationTrace:
    """A training-shaped trace of about `n_allocations` blocks, for benchmarks and tests.

    Weights and optimizer state live throughout; each iteration's forward pass keeps one activation per
    layer until the matching backward step frees it (the LIFO shape of backprop) and allocates short-lived
    temporaries; backward allocates a gradient per layer, freed at the optimizer step. Sizes are drawn
    from a few hundred shapes, 512-byte multiples, 4 KiB to 64 MiB (log-uniform).
    """
    rng = np.random.default_rng(seed)
    shapes = (np.exp(rng.uniform(np.log(4096), np.log(64 << 20), 300)).astype(np.int64) // 512 + 1) * 512
    rows: list[tuple[int, float, float]] = []
    n_weights = max(1, int(n_allocations * weight_fraction) // 50)
    for _ in range(n_weights):
        rows.append((int(rng.choice(shapes)), 0.0, float("inf")))
    layer_act = rng.choice(shapes, layers)
    t = 1.0
    while len(rows) < n_allocations:
        acts: list[tuple[int, float]] = []
        for layer in range(layers):
            for _ in range(int(rng.integers(0, 3))):  # temporaries inside the op
                rows.append((int(rng.choice(shapes)), t, t + float(rng.integers(1, 4))))
                t += 1.0
            acts.append((int(layer_act[layer]), t))
            t += 1.0
        grads: list[tuple[int, float]] = []
        for layer in reversed(range(layers)):
            size, born = acts[layer]
            for _ in range(int(rng.integers(1, 3))):
                rows.append((int(rng.choice(shapes)), t, t + float(rng.integers(1, 3))))
                t += 1.0
            grads.append((int(layer_act[layer]) // 4 // 512 * 512 + 512, t))
            rows.append((size, born, t))
            t += 1.0
        for size, born in grads:
            rows.append((size, born, t))
        t += 2.0
    return from_triples(rows[:n_allocations])
