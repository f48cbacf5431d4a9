"""`PYTORCH_CUDA_ALLOC_CONF` computed per real trace: each device's allocator trace replayed through the
caching-allocator simulation under every candidate setting (server.analysis.planning.alloc_conf), from an empty cache.

Every real Kineto trace in tests/data/kineto whose `[memory]` events carry `Addr` and `Total Reserved`. Columns,
MiB: alloc = blocks allocated at once (the floor of any setting), rec = the trace's recorded reserved peak,
base = simulated with the defaults, best = the lowest simulated reserved peak and its setting, saving = base - best.
No capacity is simulated (the garbage-collection threshold, which needs a memory cap, is left out).

    .venv/bin/python bench/alloc_conf.py [TRACE ...]
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from bench.report import write_report  # noqa: E402
from server.analysis.planning.alloc_conf import recommend_alloc_conf  # noqa: E402
from server.analysis.planning.reserved_replay import read_memory_events  # noqa: E402

KINETO = REPO / "tests" / "data" / "kineto"
MIB = 1 << 20


def main(argv: list[str]) -> None:
    paths = [Path(a) for a in argv] or sorted(KINETO.rglob("*.json.gz"))
    print(f"{'trace':<44} {'device':<7} {'events':>6} {'alloc':>6} {'rec':>6} {'base':>6} {'best':>6} "
          f"{'saving':>6} {'%':>5} {'cands':>5} {'s':>5}  setting")
    figures: dict[str, dict[str, float | int | str | None]] = {}
    for path in paths:
        name = str(path.relative_to(KINETO)) if path.is_relative_to(KINETO) else path.name
        for dev in read_memory_events(path):
            if not dev.events:
                continue
            t0 = time.perf_counter()
            a = recommend_alloc_conf(dev.events, device=dev.device, trace_name=path.name)
            seconds = time.perf_counter() - t0
            base, best, saving = a.baseline_peak_reserved_bytes, a.best_peak_reserved_bytes, a.saving_bytes
            assert base is not None and best is not None and saving is not None  # no capacity: nothing runs out
            print(f"{name[-44:]:<44} {a.device:<7} {a.events:>6} {a.peak_allocated_bytes / MIB:>6.0f} "
                  f"{(a.recorded_peak_reserved_bytes or 0) / MIB:>6.0f} {base / MIB:>6.0f} {best / MIB:>6.0f} "
                  f"{saving / MIB:>6.0f} {a.saving_pct or 0:>5.1f} {len(a.candidates):>5} {seconds:>5.1f}  "
                  f"{a.best_alloc_conf or '(defaults)'}")
            figures[f"{name} {a.device}"] = {
                "memory_events_count": a.events,
                "peak_allocated_bytes": a.peak_allocated_bytes,
                "recorded_peak_reserved_bytes": a.recorded_peak_reserved_bytes,
                "baseline_peak_reserved_bytes": base,
                "best_alloc_conf": a.best_alloc_conf,
                "best_peak_reserved_bytes": best,
                "saving_bytes": saving,
                "saving_pct": a.saving_pct,
                "candidates_count": len(a.candidates),
                "search_s": seconds,
                **{f"{c.alloc_conf or 'defaults'} peak_reserved_bytes": c.peak_reserved_bytes for c in a.candidates},
            }
    print(f"wrote {write_report(__file__, figures)}")


if __name__ == "__main__":
    main(sys.argv[1:])
