"""The allocator simulation replayed on real H100 traces' allocations, against their recorded `Total Reserved`.

The bound is the issue's 5 %: from an empty cache on the two smaller H100 traces, from the segments the addresses
reveal on the timesformer trace, whose two 1802 MiB blocks make the empty-cache replay one segment off
(bench/results/reserved_replay.md has all four traces and why each differs)."""

from __future__ import annotations

from pathlib import Path

import pytest

from server.analysis.planning.allocator import K_SMALL_BUFFER, CachingAllocatorSim
from server.analysis.planning.reserved_replay import DeviceMemoryEvents, MemoryEvent, replay_device, replay_trace

MiB = 1 << 20
H100 = "Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz", "gaunernst_bert-small-uncased__1016001.json.gz"
TIMESFORMER = "facebook_timesformer-base-finetuned-k400__1016002.json.gz"


@pytest.mark.parametrize("name", H100)
def test_replay_of_a_real_trace_is_within_5_pct_of_its_recorded_reserved(real_data: Path, name: str) -> None:
    [result] = replay_trace(real_data / "kineto" / "tracelens" / "h100" / name)
    assert result.device == "cuda:0"
    assert result.inconsistent_events == 0  # the trace order rebuilds every recorded Total Allocated
    # the simulation's allocated memory is the recorded one rounded to 512 B blocks: a check of the pairing
    assert 0 <= result.simulated_peak_allocated_bytes - result.recorded_peak_allocated_bytes < 0.01 * result.recorded_peak_allocated_bytes
    assert abs(result.cold_error_pct) <= 5.0
    # the addresses prove a lower bound the recorded reserved must respect
    assert result.pre_window_allocated_bytes + result.window_touched_bytes <= result.recorded_peak_reserved_bytes


def test_seeded_replay_needs_no_segment_the_real_allocator_did_not_have(real_data: Path) -> None:
    [result] = replay_trace(real_data / "kineto" / "tracelens" / "h100" / TIMESFORMER)
    assert result.cold_peak_reserved_bytes - result.recorded_peak_reserved_bytes > 1000 * MiB  # one 1802 MiB too many
    assert result.seeded_new_segment_bytes == 0
    assert abs(result.seeded_error_pct) <= 5.0


def _event(addr: int, nbytes: int, allocated: int) -> MemoryEvent:
    return MemoryEvent(0.0, addr, nbytes, allocated, 64 * MiB)


def test_pre_window_blocks_and_seeded_segments() -> None:
    # 8 MiB live before the window, 4 MiB of it freed inside; two 3 MiB blocks at addresses 20 MiB apart
    events = [
        _event(0x1000000, -4 * MiB, 4 * MiB),
        _event(0x4000000, 3 * MiB, 7 * MiB),
        _event(0x5400000, 3 * MiB, 10 * MiB),
        _event(0x4000000, -3 * MiB, 7 * MiB),
        _event(0x5400000, -3 * MiB, 4 * MiB),
    ]
    result = replay_device(DeviceMemoryEvents("cuda:0", events, 0))
    assert result.pre_window_allocated_bytes == 8 * MiB
    assert result.window_touched_bytes == 6 * MiB
    assert result.seeded_segment_bytes == 8 * MiB  # two 4 MiB (2 MiB-aligned) runs that do not touch
    assert result.seeded_new_segment_bytes == 0
    # cold: one 20 MiB segment (kLargeBuffer) holds the two 4 MiB pre-window blocks and both 3 MiB blocks
    assert result.cold_peak_reserved_bytes == 20 * MiB
    assert result.seeded_peak_reserved_bytes == 28 * MiB


def test_seeded_segment_is_reused_before_a_new_one() -> None:
    sim = CachingAllocatorSim()
    sim.seed_segment(K_SMALL_BUFFER, True)
    sim.malloc(1, 1000)
    assert sim.reserved == K_SMALL_BUFFER and sim.stats.segments == 1
