"""The allocator's own history (a `fleetprof.snapshot.v1` document's events, what `fleetprof run --trace-allocator`
records) replays like the Kineto `[memory]` events it mirrors: a real Kineto memory trace, rewritten as allocator
history, gives back the same event sequence, running totals and allocator-setting comparison."""

from __future__ import annotations

from pathlib import Path

from server.analysis.planning.alloc_conf import recommend_alloc_conf
from server.analysis.planning.reserved_replay import memory_events_from_allocator, read_memory_events

TRACE = Path(__file__).parents[1] / "data/kineto/hta/df_index_resolver/df_index_resolver.json.gz"


def _as_history(events) -> list[dict]:  # type: ignore[no-untyped-def]
    out = []
    for e in events:
        action = "alloc" if e.nbytes > 0 else "free_requested"
        out.append({"action": action, "addr": e.addr, "size": abs(e.nbytes), "time_us": e.ts_us})
        if action == "free_requested":  # the allocator reuses a block once its streams are done with it
            out.append({"action": "free_completed", "addr": e.addr, "size": abs(e.nbytes), "time_us": e.ts_us})
    return out


def test_history_replays_as_the_kineto_events_it_mirrors() -> None:
    [kineto] = read_memory_events(TRACE)
    last = kineto.events[-1]
    dev = memory_events_from_allocator(_as_history(kineto.events), allocated_after_bytes=last.total_allocated_bytes,
                                       reserved_after_bytes=None)
    assert [(e.addr, e.nbytes, e.total_allocated_bytes) for e in dev.events] == \
        [(e.addr, e.nbytes, e.total_allocated_bytes) for e in kineto.events]
    assert dev.inconsistent_events == 0
    a = recommend_alloc_conf(kineto.events)
    b = recommend_alloc_conf(dev.events)
    assert (a.best_alloc_conf, a.best_peak_reserved_bytes, a.baseline_peak_reserved_bytes) == \
        (b.best_alloc_conf, b.best_peak_reserved_bytes, b.baseline_peak_reserved_bytes)


def test_without_the_snapshot_totals_the_unmatched_frees_are_what_was_live() -> None:
    history = [{"action": "free_completed", "addr": 4096, "size": 1024, "time_us": 0.0},
               {"action": "alloc", "addr": 8192, "size": 512, "time_us": 1.0},
               {"action": "segment_alloc", "addr": 1 << 21, "size": 2 << 20, "time_us": 1.5},
               {"action": "free_requested", "addr": 8192, "size": 512, "time_us": 2.0},
               {"action": "free_completed", "addr": 8192, "size": 512, "time_us": 3.0}]
    dev = memory_events_from_allocator(history, allocated_after_bytes=None, reserved_after_bytes=None)
    # free_completed is the free (free_requested is skipped when the history has completions)
    assert [(e.nbytes, e.total_allocated_bytes) for e in dev.events] == [(-1024, 0), (512, 512), (-512, 0)]
    assert dev.inconsistent_events == 0


H100 = Path(__file__).parents[1] / "recorded/h100"
# the runs' own reserved peaks (their reports; tests/recorded/h100/README.md)
DEFAULTS_RESERVED_BYTES = 5_265_948_672
EXPANDABLE_RESERVED_BYTES = 4_555_014_144


def _advice(name: str):  # type: ignore[no-untyped-def]
    import gzip
    import json

    from server.analysis.traces.snapshot import parse_snapshot_json
    from server.traces.service import snapshot_alloc_conf_advice

    snap = parse_snapshot_json(json.loads(gzip.open(H100 / name).read()))
    return snapshot_alloc_conf_advice(snap.to_dict(), snap.allocator_events(), snap.busiest_device())


def test_the_h100_history_predicts_what_the_setting_then_did_on_the_h100() -> None:
    """A real H100 run's allocator history (variable sequence lengths, defaults) is replayed through the
    simulation; its recommendation, applied to the next real run, reserved what the simulation said it would."""
    advice = _advice("h100_varlen_transformer_defaults.json.gz")
    assert advice.best_alloc_conf == "expandable_segments:True"
    # the defaults' simulated peak is the real run's (the snapshot's totals anchor the replay)
    assert abs(advice.baseline_peak_reserved_bytes - DEFAULTS_RESERVED_BYTES) / DEFAULTS_RESERVED_BYTES < 0.05
    # and the setting's simulated peak is what the second real run reserved, within 5 %
    assert abs(advice.best_peak_reserved_bytes - EXPANDABLE_RESERVED_BYTES) / EXPANDABLE_RESERVED_BYTES < 0.05


def test_a_run_already_on_the_setting_is_not_told_to_set_it_again() -> None:
    """The second run's own history still simulates better with expandable segments than with the defaults (it
    ran with them): the report drops the recommendation when the hooks say the job already runs with it."""
    from fleetprof.report import FrameworkSection
    from server.analysis.planning.alloc_conf_advice import alloc_conf_recommendation
    from server.analysis.traces.sections import _already_set

    advice = _advice("h100_varlen_transformer_expandable.json.gz")
    rec = alloc_conf_recommendation(advice)
    assert rec is not None and rec["evidence"]["env"] == "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"
    framework = FrameworkSection.model_construct(cuda_alloc_conf="expandable_segments:True")
    assert _already_set(rec, framework)
    assert _already_set(rec, FrameworkSection.model_construct(
        cuda_alloc_conf="max_split_size_mb:512, expandable_segments:True"))
    assert not _already_set(rec, FrameworkSection.model_construct(cuda_alloc_conf=""))  # the defaults
    assert not _already_set(rec, FrameworkSection.model_construct(cuda_alloc_conf=None))  # unknown
    assert not _already_set(rec, None)
