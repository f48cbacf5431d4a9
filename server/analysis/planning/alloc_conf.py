"""`PYTORCH_CUDA_ALLOC_CONF` computed, not guessed: one device's allocator trace replayed through the
caching-allocator simulation under each candidate setting; the lowest simulated reserved peak wins.

The replay is the cold one of `reserved_replay` (the blocks live before the window first, then the window, from an
empty cache), so every candidate starts from the same state; the seeded replay's segments are the defaults' own
history and would favour them. What the comparison can and cannot see: the events carry block sizes already
rounded to 512 B (and a large block the allocator did not split keeps its remainder), so settings change where
blocks go and how segments grow, not the recorded sizes; streams are not in the events (allocator.py).

`garbage_collection_threshold` acts only when the allowed memory is capped, so it is a candidate only with a
capacity, and its note says the cap (`torch.cuda.set_per_process_memory_fraction`) must be set too.
"""

from __future__ import annotations

from collections.abc import Sequence

from fleetprof.report import AllocConfAdvice, AllocConfCandidate
from server.analysis.planning.allocator import AllocConf, CachingAllocatorSim, SimulatedOutOfMemory, round_size
from server.analysis.planning.reserved_replay import MemoryEvent, replay_sequence

# max_split_size_mb must exceed 20 (kLargeBuffer); roundup_power2_divisions must be a power of two
MAX_SPLIT_SIZES_MB = (32, 64, 128, 256, 512)
ROUNDUP_DIVISIONS = (2, 4, 8, 16)
GC_THRESHOLDS = (0.6, 0.8)
GC_NOTE = "acts only with torch.cuda.set_per_process_memory_fraction set to the capacity simulated"
MIN_SAVING_BYTES = 1 << 20  # a setting must save at least this much to be recommended over the defaults


def candidate_confs(capacity_bytes: int | None) -> list[AllocConf]:
    """The defaults first, then one setting at a time (and expandable segments with each rounding)."""
    confs = [AllocConf(), AllocConf(expandable_segments=True)]
    confs += [AllocConf(max_split_size_mb=m) for m in MAX_SPLIT_SIZES_MB]
    confs += [AllocConf(roundup_power2_divisions=d) for d in ROUNDUP_DIVISIONS]
    confs += [AllocConf(expandable_segments=True, roundup_power2_divisions=d) for d in ROUNDUP_DIVISIONS]
    if capacity_bytes is not None:
        confs += [AllocConf(garbage_collection_threshold=t) for t in GC_THRESHOLDS]
    return confs


def simulate(live: Sequence[tuple[int, int]], window: Sequence[tuple[int, int]], conf: AllocConf,
             capacity_bytes: int | None) -> CachingAllocatorSim:
    """The replay under one setting; raises SimulatedOutOfMemory."""
    sim = CachingAllocatorSim(capacity_bytes, conf=conf)
    for key, nbytes in live:
        sim.malloc(key, nbytes)
    sim.replay(window)
    return sim


def peak_allocated_bytes(live: Sequence[tuple[int, int]], window: Sequence[tuple[int, int]]) -> int:
    """Peak of the live blocks at 512 B rounding, counted without the simulation: the floor of every reserved."""
    sizes: dict[int, int] = {}
    now = peak = 0
    for key, nbytes in [*live, *window]:
        if nbytes > 0:
            sizes[key] = round_size(nbytes)
            now += sizes[key]
            peak = max(peak, now)
        else:
            now -= sizes.pop(key)
    return peak


def recommend_alloc_conf(events: list[MemoryEvent], capacity_bytes: int | None = None, *,
                         device: str = "cuda:0", trace_name: str | None = None) -> AllocConfAdvice:
    """Every candidate's simulated reserved peak and the best one, with its saving over the defaults."""
    if not events:
        raise ValueError("no allocator events to simulate")
    live, window = replay_sequence(events)
    candidates: list[AllocConfCandidate] = []
    for conf in candidate_confs(capacity_bytes):
        note = GC_NOTE if conf.garbage_collection_threshold is not None else None
        try:
            sim = simulate(live, window, conf, capacity_bytes)
        except SimulatedOutOfMemory:
            candidates.append(AllocConfCandidate(alloc_conf=conf.env_value(), peak_reserved_bytes=None,
                                                 out_of_memory=True, note=note))
            continue
        candidates.append(AllocConfCandidate(alloc_conf=conf.env_value(),
                                             peak_reserved_bytes=sim.stats.peak_reserved_bytes,
                                             out_of_memory=False, note=note))
    baseline = candidates[0].peak_reserved_bytes
    fitting = [c for c in candidates if c.peak_reserved_bytes is not None]
    # lowest peak; among equals the earlier (simpler) candidate, the defaults first
    best = min(fitting, key=lambda c: c.peak_reserved_bytes or 0) if fitting else None
    if best is not None and baseline is not None and baseline - (best.peak_reserved_bytes or 0) < MIN_SAVING_BYTES:
        best = candidates[0]
    saving = (baseline - best.peak_reserved_bytes
              if best is not None and baseline is not None and best.peak_reserved_bytes is not None else None)
    recorded = max(e.total_reserved_bytes for e in events)
    return AllocConfAdvice(
        device=device,
        events=len(events),
        source=(f"simulated: the allocator trace{f' {trace_name!r}' if trace_name else ''} ({len(events)} "
                f"[memory] events of {device}) replayed from an empty cache through the caching-allocator "
                "simulation under each setting"),
        capacity_bytes=capacity_bytes,
        peak_allocated_bytes=peak_allocated_bytes(live, window),
        recorded_peak_reserved_bytes=recorded or None,
        baseline_peak_reserved_bytes=baseline,
        candidates=candidates,
        best_alloc_conf=best.alloc_conf if best is not None else "",
        best_peak_reserved_bytes=best.peak_reserved_bytes if best is not None else None,
        saving_bytes=saving,
        saving_pct=100.0 * saving / baseline if saving is not None and baseline else None,
        env=f"PYTORCH_CUDA_ALLOC_CONF={best.alloc_conf}" if best is not None and best.alloc_conf else None,
    )
