"""bench/report.py: every benchmark's figures as one JSON object in bench/out/<script>.json."""

from __future__ import annotations

import ast
import json
import math
import socket
from pathlib import Path

import pytest

from bench.report import has_unit, machine, write_report

BENCH = Path(__file__).resolve().parents[2] / "bench"
NOT_BENCHMARKS = {"__init__.py", "scratch.py", "report.py", "zoo_rows.py"}  # helpers, not benchmarks


def test_writes_name_date_machine_and_figures(tmp_path: Path) -> None:
    path = write_report("/somewhere/bench/ingest.py", {
        "sustained_samples_per_s": 41250.5, "latency_p99_ms": 12.5, "requests_count": 400, "exactly_once_ok": True,
        "stalls_ms": [1.5, float("nan")], "per_trace": {"V100 DDP": {"arena_bytes": 1 << 30, "plan_s": float("inf")}},
        "note": "a label, not a figure", "unknown_s": None,
    }, out_dir=tmp_path)
    assert path == tmp_path / "ingest.json"
    doc = json.loads(path.read_text())  # strict JSON: NaN would not parse with allow_nan=False writers' readers
    assert doc["name"] == "ingest" and doc["date"].endswith("+00:00")
    assert doc["figures"]["sustained_samples_per_s"] == 41250.5 and doc["figures"]["requests_count"] == 400
    assert doc["figures"]["stalls_ms"] == [1.5, None]  # NaN is unknown: null, never 0
    assert doc["figures"]["per_trace"]["V100 DDP"] == {"arena_bytes": 1 << 30, "plan_s": None}
    assert doc["figures"]["unknown_s"] is None and doc["figures"]["exactly_once_ok"] is True
    m = doc["machine"]
    assert m["cpu_count"] >= 1 and m["memory_bytes"] > 0 and m["python"].count(".") == 2
    assert socket.gethostname() not in json.dumps(m)
    assert not list(tmp_path.glob("*.tmp"))  # written atomically


@pytest.mark.parametrize("figures", [{"p99": 12.5}, {"latency": [1.0, 2.0]}, {"per_page": {"fleet": {"median": 1.2}}},
                                     {"requests": 3}])
def test_a_number_whose_key_names_no_unit_is_refused(tmp_path: Path, figures: dict) -> None:
    with pytest.raises(ValueError, match="names no unit"):
        write_report("x.py", figures, out_dir=tmp_path)
    assert not (tmp_path / "x.json").exists()


def test_units_are_the_report_suffixes_plus_plain_numbers() -> None:
    assert all(has_unit(k) for k in ("p99_ms", "samples_per_s", "peak_bytes", "busy_fraction", "energy_j",
                                     "gpus_count", "arena_ratio", "check_ok", "wall_s"))
    assert not any(has_unit(k) for k in ("p99", "nodes", "latency", "speedup"))
    assert machine()["cpu_count"] is not None and not math.isnan(float(machine()["memory_bytes"] or 0))


def _uses_helper(path: Path) -> bool:
    tree = ast.parse(path.read_text())
    imported = any(isinstance(n, ast.ImportFrom) and n.module == "bench.report"
                   and any(a.name == "write_report" for a in n.names) for n in ast.walk(tree))
    called = any(isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "write_report"
                 and n.args and isinstance(n.args[0], ast.Name) and n.args[0].id == "__file__"
                 for n in ast.walk(tree))
    return imported and called


def test_every_bench_script_writes_its_figures_through_the_helper() -> None:
    scripts = sorted(p for p in BENCH.glob("*.py") if p.name not in NOT_BENCHMARKS)
    assert len(scripts) >= 10
    missing = [p.name for p in scripts if not _uses_helper(p)]
    assert missing == [], f"bench scripts that do not call write_report(__file__, ...) from bench.report: {missing}"
