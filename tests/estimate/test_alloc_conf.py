"""PYTORCH_CUDA_ALLOC_CONF settings in the allocator simulation, and the setting recommended from a trace.

Each hand-built sequence is one whose outcome under a setting follows from CUDACachingAllocator.cpp's rules
(worked out in the comments); the real traces are checked against figures the simulation does not produce."""

from __future__ import annotations

from pathlib import Path

import pytest

from server.analysis.planning.alloc_conf import GC_NOTE, recommend_alloc_conf
from server.analysis.planning.allocator import (
    DEFAULT_ALLOC_CONF,
    AllocConf,
    CachingAllocatorSim,
    SimulatedOutOfMemory,
    round_size,
)
from server.analysis.planning.reserved_replay import MemoryEvent, read_memory_events

MiB = 1 << 20
H100 = "Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz", "gaunernst_bert-small-uncased__1016001.json.gz"


def _peak(seq: list[tuple[int, int]], conf: AllocConf = DEFAULT_ALLOC_CONF, capacity: int | None = None) -> int:
    sim = CachingAllocatorSim(capacity, conf=conf)
    sim.replay(seq)
    return sim.stats.peak_reserved_bytes


# two 100 MiB blocks in their own segments, both freed, then 180 MiB: the two free segments cannot merge
FRAGMENTED = [(1, 100 * MiB), (2, 100 * MiB), (1, -1), (2, -1), (3, 180 * MiB)]


def test_expandable_segments_merge_what_fixed_segments_cannot() -> None:
    assert _peak(FRAGMENTED) == 380 * MiB  # a third segment for the 180 MiB
    # one growing segment: 200 MiB mapped in 20 MiB pages, the two frees merge into 200 MiB free, 180 fits
    assert _peak(FRAGMENTED, AllocConf(expandable_segments=True)) == 200 * MiB


def test_expandable_segments_map_whole_pages_at_the_end() -> None:
    sim = CachingAllocatorSim(conf=AllocConf(expandable_segments=True))
    sim.malloc(1, 3 * MiB)  # large pool: one 20 MiB page, 17 MiB split off (any remainder >= 512 B is split)
    sim.malloc(2, 17 * MiB)  # the free remainder at the end, no new page
    assert sim.reserved == 20 * MiB
    sim.malloc(3, 5 * MiB)  # nothing free: one more page
    sim.malloc(4, 1000)  # small pool: its own segment of 2 MiB pages
    assert sim.reserved == 42 * MiB and sim.stats.segments == 2
    sim.free(3)
    sim.malloc(5, 30 * MiB)  # the free 15 MiB at the end grows by one page (35 MiB), not two
    assert sim.reserved == 62 * MiB


def test_max_split_size_keeps_small_requests_out_of_large_blocks() -> None:
    # a 400 MiB block freed; 50 MiB splits it by default, so the next 400 MiB needs a new segment
    seq = [(1, 400 * MiB), (1, -1), (2, 50 * MiB), (3, 400 * MiB)]
    assert _peak(seq) == 800 * MiB
    # with max_split_size_mb:256 the 400 MiB block is oversize: 50 MiB gets its own segment, 400 MiB reuses
    assert _peak(seq, AllocConf(max_split_size_mb=256)) == 450 * MiB


def test_max_split_size_frees_oversize_blocks_before_the_whole_cache() -> None:
    sim = CachingAllocatorSim(500 * MiB, conf=AllocConf(max_split_size_mb=64))
    sim.replay([(1, 100 * MiB), (2, 300 * MiB), (1, -1), (2, -1), (3, 40 * MiB), (4, 150 * MiB)])
    # 150 MiB over capacity (440 + 150): the smallest cached oversize block of at least 150 MiB (300) is freed,
    # the 100 MiB one stays cached
    assert sim.reserved == 290 * MiB and sim.stats.cache_flushes == 0


def test_roundup_power2_divisions() -> None:
    assert round_size(100 * MiB, 4) == 112 * MiB  # 64 MiB floor, steps of 16 MiB
    assert round_size(64 * MiB, 4) == 64 * MiB  # a power of two stays
    assert round_size(65 * MiB, 2) == 96 * MiB
    assert round_size(1500, 4) == 1536  # not above 512 x 4: 512 B rounding
    # growing requests (variable sequence lengths): each needs a new segment, unless rounded to one bucket
    seq: list[tuple[int, int]] = []
    for i, size_mib in enumerate(range(100, 112, 2)):
        seq += [(i, size_mib * MiB), (i, -1)]
    assert _peak(seq) == sum(range(100, 112, 2)) * MiB  # 630 MiB: no earlier block fits the next request
    assert _peak(seq, AllocConf(roundup_power2_divisions=4)) == 112 * MiB


def test_garbage_collection_frees_the_oldest_cached_segments_only_under_a_cap() -> None:
    seq = [(1, 300 * MiB), (1, -1), (2, 400 * MiB), (2, -1), (3, 450 * MiB)]
    assert _peak(seq, capacity=2000 * MiB) == 1150 * MiB
    # threshold 600 MiB: at the 450 MiB request 700 MiB are reserved; the 300 MiB segment, older than the mean,
    # is freed (100 MiB needed), the 400 MiB one stays
    gc = AllocConf(garbage_collection_threshold=0.3)
    assert _peak(seq, gc, capacity=2000 * MiB) == 850 * MiB
    assert _peak(seq, gc) == 1150 * MiB  # no cap (no memory fraction): the threshold does nothing


def test_env_value() -> None:
    assert AllocConf().env_value() == ""
    assert AllocConf(expandable_segments=True, roundup_power2_divisions=4).env_value() == (
        "expandable_segments:True,roundup_power2_divisions:4")
    assert AllocConf(max_split_size_mb=128, garbage_collection_threshold=0.6).env_value() == (
        "max_split_size_mb:128,garbage_collection_threshold:0.6")


def _events(seq: list[tuple[int, int]]) -> list[MemoryEvent]:
    """Kineto-like events for a (key, nbytes) sequence: one address per key, running totals."""
    out, sizes, total = [], {}, 0
    for key, nbytes in seq:
        if nbytes > 0:
            sizes[key] = nbytes
        else:
            nbytes = -sizes.pop(key)
        total += nbytes
        out.append(MemoryEvent(0.0, 0x7F0000000000 + key * (1 << 32), nbytes, total, 0))
    return out


def test_recommendation_for_a_fragmentation_pattern() -> None:
    advice = recommend_alloc_conf(_events(FRAGMENTED))
    assert advice.baseline_peak_reserved_bytes == 380 * MiB
    assert advice.best_alloc_conf == "expandable_segments:True"
    assert advice.env == "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"
    assert advice.saving_bytes == 180 * MiB and advice.saving_pct == pytest.approx(100 * 180 / 380)
    assert advice.peak_allocated_bytes == 200 * MiB
    assert all(c.note != GC_NOTE for c in advice.candidates)  # no cap: no garbage-collection candidate


def test_no_setting_recommended_when_none_saves() -> None:
    advice = recommend_alloc_conf(_events([(1, 100 * MiB), (1, -1)]))
    assert advice.best_alloc_conf == "" and advice.env is None and advice.saving_bytes == 0


def test_a_setting_that_fits_where_the_defaults_run_out() -> None:
    # two 4 MiB blocks split from one 20 MiB segment, the first freed: the segment holds a live block, so the
    # cache flush cannot return it and 30 MiB more exceeds 40 MiB; one expandable segment grows its free 12 MiB
    # end by one 20 MiB page instead
    seq = [(1, 4 * MiB), (2, 4 * MiB), (1, -1), (3, 30 * MiB)]
    with pytest.raises(SimulatedOutOfMemory):
        CachingAllocatorSim(40 * MiB).replay(seq)
    advice = recommend_alloc_conf(_events(seq), capacity_bytes=40 * MiB)
    assert advice.baseline_peak_reserved_bytes is None and advice.candidates[0].out_of_memory
    assert advice.best_alloc_conf == "expandable_segments:True" and advice.best_peak_reserved_bytes == 40 * MiB
    assert advice.saving_bytes is None  # no baseline to save against
    assert [c.note for c in advice.candidates if "garbage" in c.alloc_conf] == [GC_NOTE, GC_NOTE]


@pytest.mark.parametrize("name", H100)
def test_recommendation_from_a_real_trace(real_data: Path, name: str) -> None:
    [dev] = read_memory_events(real_data / "kineto" / "tracelens" / "h100" / name)
    advice = recommend_alloc_conf(dev.events, device=dev.device, trace_name=name)
    recorded_allocated = max(e.total_allocated_bytes for e in dev.events)  # the real allocator's own figure
    assert advice.baseline_peak_reserved_bytes is not None and advice.best_peak_reserved_bytes is not None
    # no setting reserves less than the blocks live at once (recorded by the real allocator, and our count)
    for c in advice.candidates:
        assert c.peak_reserved_bytes is not None and c.peak_reserved_bytes >= recorded_allocated
        assert c.peak_reserved_bytes >= advice.peak_allocated_bytes
    assert advice.best_peak_reserved_bytes <= advice.baseline_peak_reserved_bytes
    assert advice.saving_bytes == advice.baseline_peak_reserved_bytes - advice.best_peak_reserved_bytes
    # the defaults' simulation is the one checked against the recorded reserved (test_reserved_replay): within 5 %
    assert advice.recorded_peak_reserved_bytes is not None
    assert abs(advice.baseline_peak_reserved_bytes / advice.recorded_peak_reserved_bytes - 1) <= 0.05
    assert advice.best_alloc_conf and advice.saving_bytes >= 1 * MiB  # both traces: a setting saves memory
    assert advice.best_alloc_conf in {c.alloc_conf for c in advice.candidates}
