from __future__ import annotations

import dataclasses

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from server.analysis.planning.packing import ALGORITHMS, OffsetPlan, aligned_sizes, plan_offsets, verify_plan
from server.analysis.traces.alloc_trace import from_triples, max_live_bytes, synthetic_training_trace

triples = st.lists(
    st.tuples(
        st.integers(0, 5000),  # size: zero, sub-alignment and multi-block sizes
        st.integers(0, 60),  # start
        st.one_of(st.integers(0, 40), st.none()),  # duration; None = never freed
    ),
    min_size=0,
    max_size=60,
).map(lambda rows: from_triples([(s, t, None if d is None else t + d) for s, t, d in rows]))


def _brute_force_conflicts(trace, offsets, sizes) -> bool:
    for i in range(len(trace)):
        for j in range(i + 1, len(trace)):
            if sizes[i] == 0 or sizes[j] == 0:
                continue
            live_together = trace.alloc_seq[i] < trace.free_seq[j] and trace.alloc_seq[j] < trace.free_seq[i]
            share = offsets[i] < offsets[j] + sizes[j] and offsets[j] < offsets[i] + sizes[i]
            if live_together and share:
                return True
    return False


@settings(max_examples=60, deadline=None)
@given(trace=triples, alignment=st.sampled_from([1, 64, 512]))
def test_every_algorithm_gives_a_valid_plan_above_the_lower_bound(trace, alignment) -> None:
    sizes = aligned_sizes(trace, alignment)
    lower = max_live_bytes(trace, sizes)
    for name in ALGORITHMS:
        plan = plan_offsets(trace, alignment=alignment, algorithms=(name,))
        assert plan.algorithm == name
        assert verify_plan(trace, plan) == [], name
        assert not _brute_force_conflicts(trace, plan.offsets, sizes), name
        assert plan.arena_bytes >= plan.lower_bound_bytes == lower
        assert np.all(plan.offsets % alignment == 0)
    best = plan_offsets(trace, alignment=alignment)
    assert best.arena_bytes == min(best.arena_by_algorithm_bytes.values())


@settings(max_examples=60, deadline=None)
@given(trace=triples, data=st.data())
def test_verify_plan_catches_a_broken_plan(trace, data) -> None:
    plan = plan_offsets(trace, alignment=1)
    sizes = aligned_sizes(trace, 1)
    # find two blocks live together with bytes, and stack the second onto the first
    pairs = [
        (i, j)
        for i in range(len(trace))
        for j in range(len(trace))
        if i != j and sizes[i] and sizes[j]
        and trace.alloc_seq[i] < trace.free_seq[j] and trace.alloc_seq[j] < trace.free_seq[i]
    ]
    if not pairs:
        return
    i, j = data.draw(st.sampled_from(pairs))
    offsets = plan.offsets.copy()
    offsets[j] = offsets[i] + data.draw(st.integers(0, int(sizes[i]) - 1))
    broken = dataclasses.replace(plan, offsets=offsets, arena_bytes=int((offsets + sizes).max()))
    assert _brute_force_conflicts(trace, offsets, sizes)
    assert verify_plan(trace, broken) != []


def test_verify_plan_catches_out_of_arena_and_shape() -> None:
    trace = from_triples([(512, 0, 2), (512, 1, 3)])
    plan = plan_offsets(trace)
    assert verify_plan(trace, dataclasses.replace(plan, arena_bytes=512)) != []
    assert verify_plan(trace, dataclasses.replace(plan, offsets=plan.offsets[:1])) != []


def test_real_traces_within_five_percent_of_the_lower_bound(real_traces) -> None:
    for name, tr in real_traces.items():
        plan = plan_offsets(tr)
        assert verify_plan(tr, plan) == [], name
        assert plan.arena_bytes <= 1.05 * plan.lower_bound_bytes, (name, plan.arena_by_algorithm_bytes)
        # and far below what the caching allocator reserved for the same blocks
        assert tr.untracked_live_bytes + plan.arena_bytes <= tr.observed_reserved_bytes, name


def test_large_trace_plans_and_verifies() -> None:
    tr = synthetic_training_trace(30_000, seed=1)
    plan = plan_offsets(tr)
    assert verify_plan(tr, plan) == []
    assert plan.arena_bytes <= 1.10 * plan.lower_bound_bytes


def test_empty_and_zero_size_traces() -> None:
    for tr in (from_triples([]), from_triples([(0, 0, 1), (0, 0, 2)])):
        plan = plan_offsets(tr)
        assert plan.arena_bytes == plan.lower_bound_bytes == 0
        assert verify_plan(tr, plan) == []


def test_plan_is_a_plain_offset_plan() -> None:
    plan = plan_offsets(from_triples([(1000, 0, 4), (1000, 2, 6), (3000, 5, 9)]))
    assert isinstance(plan, OffsetPlan) and plan.offsets.dtype == np.int64
    assert plan.arena_bytes == plan.lower_bound_bytes == 1024 + 3072
