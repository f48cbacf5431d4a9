"""The CUDA caching allocator simulation against the rules of CUDACachingAllocator.cpp."""

from __future__ import annotations

import random

import pytest

from server.analysis.planning.allocator import (
    K_LARGE_BUFFER,
    K_SMALL_BUFFER,
    CachingAllocatorSim,
    SimulatedOutOfMemory,
    allocation_size,
    round_size,
)

MiB = 1 << 20


def test_rounding_and_segment_sizes() -> None:
    assert round_size(1) == 512 and round_size(512) == 512 and round_size(513) == 1024
    assert allocation_size(MiB) == K_SMALL_BUFFER  # small pool: 2 MiB segments
    assert allocation_size(MiB + 512) == K_LARGE_BUFFER  # 1-10 MiB: 20 MiB segments
    assert allocation_size(10 * MiB) == 10 * MiB  # >= 10 MiB: rounded to 2 MiB
    assert allocation_size(11 * MiB) == 12 * MiB


def test_small_requests_share_one_segment() -> None:
    sim = CachingAllocatorSim()
    sim.replay([(i, 1000) for i in range(100)])  # 100 x 1024 B blocks fit one 2 MiB segment
    assert sim.stats.peak_reserved_bytes == K_SMALL_BUFFER
    assert sim.stats.peak_allocated_bytes == 100 * 1024
    assert sim.stats.peak_requested_bytes == 100 * 1000


def test_large_split_reuse_and_merge() -> None:
    sim = CachingAllocatorSim()
    sim.malloc(1, 4 * MiB)  # 20 MiB segment, split: 16 MiB remainder stays free
    sim.malloc(2, 4 * MiB)  # best fit: the remainder, no new segment
    assert sim.stats.peak_reserved_bytes == K_LARGE_BUFFER
    sim.free(1)
    sim.free(2)  # both merge back with the remainder into one 20 MiB free block
    sim.malloc(3, 18 * MiB)
    assert sim.reserved == K_LARGE_BUFFER
    # a large block whose remainder would be <= 1 MiB is not split
    sim.free(3)
    sim.malloc(4, 19 * MiB + 512)
    assert sim.allocated == K_LARGE_BUFFER


def test_best_fit_picks_the_smallest_block() -> None:
    sim = CachingAllocatorSim()
    sim.malloc(1, 30 * MiB)
    sim.malloc(2, 12 * MiB)
    sim.free(1)
    sim.free(2)
    sim.malloc(3, 12 * MiB)  # the 12 MiB segment, not a split of the 30 MiB one
    assert sim.allocated == 12 * MiB and sim.reserved == 42 * MiB
    sim.malloc(4, 30 * MiB)
    assert sim.reserved == 42 * MiB


def test_cached_segments_released_before_oom() -> None:
    sim = CachingAllocatorSim(capacity_bytes=64 * MiB)
    sim.malloc(1, 40 * MiB)
    sim.free(1)  # cached, reserved stays 40 MiB
    sim.malloc(2, 50 * MiB)  # 40 + 50 > 64: the free segment is released, then it fits
    assert sim.stats.cache_flushes == 1 and sim.reserved == 50 * MiB
    with pytest.raises(SimulatedOutOfMemory):
        sim.malloc(3, 20 * MiB)


def test_random_trace_invariants() -> None:
    """Live blocks never overlap; allocated <= reserved; all frees return the allocator to zero allocated."""
    rng = random.Random(7)
    sim = CachingAllocatorSim()
    live: list[int] = []
    for key in range(3000):
        if live and rng.random() < 0.45:
            sim.free(live.pop(rng.randrange(len(live))))
        else:
            sim.malloc(key, rng.choice([rng.randint(1, 4096), rng.randint(1, 3 * MiB), rng.randint(1, 40 * MiB)]))
            live.append(key)
        assert sim.allocated <= sim.reserved
        if key % 500 == 0:
            spans = sorted((b.addr, b.addr + b.size) for b, _ in sim._live.values())
            assert all(a_end <= b_start for (_, a_end), (b_start, _) in zip(spans, spans[1:]))
    for key in live:
        sim.free(key)
    assert sim.allocated == 0 and sim.requested == 0
