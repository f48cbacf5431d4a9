"""Kineto trace import: our streaming summary vs HolisticTraceAnalysis' load, per real trace.

Prints, per trace: size on disk, decompressed JSON size, events, wall time and peak RSS of
`server.analysis.traces.kineto.summarize_trace`, and wall time and peak RSS of HTA's
`TraceAnalysis(trace_dir=...)` (which loads the trace into DataFrames). Each measurement runs in its
own subprocess (peak RSS = `ru_maxrss`); "+MB" is the peak above that interpreter's RSS after its imports,
i.e. what the parse itself cost.

    .venv/bin/python bench/kineto_parse.py [TRACE ...]      (default: the larger traces in tests/data)
"""

from __future__ import annotations

import json
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from bench.report import write_report  # noqa: E402

KINETO = REPO / "tests" / "data" / "kineto"
DEFAULT = [
    "hta/df_index_resolver/df_index_resolver.json.gz",
    "hta/trace_diff/control/control.json.gz",
    "hta/negative_queue_length_values_check/rank0.json.gz",
    "hta/ns_resolution_trace/rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz",
    "hta/nccl_parser_config/nccl_data.json.gz",
    "kineto-tb/samples/resnet50_num_workers_0/worker0.1623143089861.pt.trace.json.gz",
    "param/resnet_kineto.json.gz",
    "tracelens/mi300/resnet_act_checkpoint.json.gz",
]


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def _child(which: str, path: str) -> None:
    """Runs in the subprocess: import, note RSS, parse, print JSON."""
    import logging
    import warnings

    warnings.simplefilter("ignore")
    if which == "ours":
        sys.path.insert(0, str(REPO))
        from server.analysis.traces.kineto import summarize_trace

        base = _rss_mb()
        t0 = time.perf_counter()
        s = summarize_trace(Path(path))
        dt = time.perf_counter() - t0
        print(json.dumps({"s": dt, "rss_mb": _rss_mb(), "base_mb": base, "events": s.counts["events"],
                          "json_bytes": s.trace_bytes}))
        return
    from hta.configs.config import logger
    from hta.trace_analysis import TraceAnalysis

    logger.setLevel(logging.ERROR)
    base = _rss_mb()
    with tempfile.TemporaryDirectory() as d:
        shutil.copy(path, d)
        t0 = time.perf_counter()
        try:
            TraceAnalysis(trace_dir=d)
            err = None
        except Exception as exc:  # HTA fails on some real traces; report it
            err = f"{exc.__class__.__name__}"
        dt = time.perf_counter() - t0
    print(json.dumps({"s": dt, "rss_mb": _rss_mb(), "base_mb": base, "error": err}))


def _measure(which: str, path: Path) -> dict[str, float]:
    out = subprocess.run(
        [sys.executable, __file__, "--child", which, str(path)], capture_output=True, text=True, check=True
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv: list[str]) -> int:
    if argv[:1] == ["--child"]:
        _child(argv[1], argv[2])
        return 0
    paths = [Path(a) for a in argv] or [KINETO / p for p in DEFAULT]
    head = (f"{'trace':44} {'disk MB':>7} {'JSON MB':>7} {'events':>8} | {'ours s':>6} {'RSS MB':>6} {'+MB':>5}"
            f" | {'HTA s':>6} {'RSS MB':>6} {'+MB':>5} | {'+MB HTA/ours':>12}")
    print(head)
    print("-" * len(head))
    figures: dict[str, dict[str, object]] = {}
    for p in paths:
        ours = _measure("ours", p)
        hta = _measure("hta", p)
        ours_d = ours["rss_mb"] - ours["base_mb"]
        hta_d = hta["rss_mb"] - hta["base_mb"]
        hta_s = f"{hta['s']:6.2f}" if not hta.get("error") else f"{hta['error'][:6]:>6}"
        print(
            f"{p.name[:44]:44} {p.stat().st_size / 1e6:7.2f} {ours['json_bytes'] / 1e6:7.1f} {ours['events']:8d} | "
            f"{ours['s']:6.2f} {ours['rss_mb']:6.0f} {ours_d:5.0f} | {hta_s} {hta['rss_mb']:6.0f} {hta_d:5.0f} | "
            f"{hta_d / max(ours_d, 1.0):12.1f}"
        )
        mib = 2**20  # _rss_mb is in MiB
        figures[p.name] = {
            "disk_bytes": p.stat().st_size, "json_bytes": ours["json_bytes"], "events_count": ours["events"],
            "ours_s": ours["s"], "ours_rss_bytes": ours["rss_mb"] * mib, "ours_added_bytes": ours_d * mib,
            "hta_s": None if hta.get("error") else hta["s"], "hta_error": hta.get("error"),
            "hta_rss_bytes": hta["rss_mb"] * mib, "hta_added_bytes": hta_d * mib,
            "hta_to_ours_added_ratio": hta_d / max(ours_d, 1.0)}
    write_report(__file__, {"traces": figures})
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
