"""Reserved memory of real traces: the caching-allocator simulation replayed on their allocations vs the recorded
`Total Reserved`, per trace and device (server.analysis.planning.reserved_replay says what is modelled and how).

Every real Kineto trace in tests/data/kineto whose `[memory]` events carry `Addr` and `Total Reserved` is read
(the 2021 kineto-tb traces carry only `Bytes`; the others no memory events). Columns, MiB unless marked:
pre = live before the window, rec = recorded peak reserved, touched = bytes the window's blocks cover (from their
addresses, no simulation), untouched = rec - pre - touched, cold = simulated peak reserved from an empty cache,
seeded = simulated from the segments the addresses reveal (new = segments it had to add), err = vs rec,
mae = mean over events of |simulated - recorded| / recorded.

    .venv/bin/python bench/reserved_replay.py [TRACE ...]
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from bench.report import write_report  # noqa: E402
from server.analysis.planning.reserved_replay import replay_trace  # noqa: E402

KINETO = REPO / "tests" / "data" / "kineto"
MIB = 1 << 20


def main(argv: list[str]) -> None:
    paths = [Path(a) for a in argv] or sorted(KINETO.rglob("*.json.gz"))
    header = (f"{'trace':<44} {'device':<7} {'events':>6} {'pre':>6} {'rec':>6} {'touched':>7} {'untouched':>9} "
              f"{'cold':>6} {'err%':>6} {'mae%':>5} {'seeded':>6} {'new':>5} {'err%':>6} {'mae%':>5} {'s':>5}")
    print(header)
    figures: dict[str, dict[str, float | int | None]] = {}
    for path in paths:
        t0 = time.perf_counter()
        results = replay_trace(path)
        seconds = time.perf_counter() - t0
        name = str(path.relative_to(KINETO)) if path.is_relative_to(KINETO) else path.name
        for r in results:
            print(f"{name[-44:]:<44} {r.device:<7} {r.events:>6} {r.pre_window_allocated_bytes / MIB:>6.0f} "
                  f"{r.recorded_peak_reserved_bytes / MIB:>6.0f} {r.window_touched_bytes / MIB:>7.0f} "
                  f"{r.untouched_reserved_bytes / MIB:>9.0f} {r.cold_peak_reserved_bytes / MIB:>6.0f} "
                  f"{r.cold_error_pct:>+6.1f} {r.cold_mean_abs_error_pct:>5.1f} "
                  f"{r.seeded_peak_reserved_bytes / MIB:>6.0f} {r.seeded_new_segment_bytes / MIB:>5.0f} "
                  f"{r.seeded_error_pct:>+6.1f} {r.seeded_mean_abs_error_pct:>5.1f} {seconds:>5.1f}")
            figures[f"{name} {r.device}"] = {
                "memory_events_count": r.events,
                "inconsistent_events_count": r.inconsistent_events,
                "pre_window_allocated_bytes": r.pre_window_allocated_bytes,
                "recorded_peak_allocated_bytes": r.recorded_peak_allocated_bytes,
                "recorded_peak_reserved_bytes": r.recorded_peak_reserved_bytes,
                "recorded_reserved_changes_count": r.recorded_reserved_changes,
                "window_touched_bytes": r.window_touched_bytes,
                "untouched_reserved_bytes": r.untouched_reserved_bytes,
                "cold_peak_reserved_bytes": r.cold_peak_reserved_bytes,
                "cold_error_pct": r.cold_error_pct,
                "cold_mean_abs_error_pct": r.cold_mean_abs_error_pct,
                "seeded_peak_reserved_bytes": r.seeded_peak_reserved_bytes,
                "seeded_new_segment_bytes": r.seeded_new_segment_bytes,
                "seeded_error_pct": r.seeded_error_pct,
                "seeded_mean_abs_error_pct": r.seeded_mean_abs_error_pct,
                "replay_s": seconds,
            }
    print(f"wrote {write_report(__file__, figures)}")


if __name__ == "__main__":
    main(sys.argv[1:])
