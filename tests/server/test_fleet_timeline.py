"""GET /fleet/timeline against an independent computation from the rollups themselves: per-hour energy, GPU count
and source aggregated in SQL, the heatmap's GPUs chosen in SQL (node name, GPU index) and cut at
MAX_HEATMAP_ROWS, unknown cells null (never 0)."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from sqlalchemy import text

from tests.server.helpers import auth

HOUR_S = 3600

# (node, index) -> {hours before the current one: (util_mean_pct, energy_j, energy_source)}
FLEET: dict[tuple[str, int], dict[int, tuple[float | None, float | None, str | None]]] = {
    ("n-b", 1): {1: (90.0, 3.0e6, "hardware_counter"), 2: (80.0, 2.5e6, "hardware_counter"),
                 3: (70.0, 2.0e6, "hardware_counter")},
    ("n-b", 0): {1: (10.0, 1.0e6, "integrated_power"), 2: (None, 1.5e6, "integrated_power"),
                 3: (30.0, None, None)},
    ("n-a", 1): {1: (55.0, 4.0e6, None), 3: (65.0, 5.0e6, "hardware_counter")},  # hour 2: no rollup
    ("n-a", 0): {2: (0.0, 0.5e6, "hardware_counter")},
    ("n-c", 0): {48: (99.0, 9.9e6, "hardware_counter")},  # rollups only before the window
    ("n-c", 1): {},                                        # none at all
}


def test_timeline_matches_the_rollups(api, make_token, db_session, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from server.fleet import dashboard_router

    monkeypatch.setattr(dashboard_router, "MAX_HEATMAP_ROWS", 3)
    h = int(time.time() // HOUR_S) * HOUR_S
    fleet = FLEET
    # Inserted out of order, so that the order of the answer is the query's.
    for node in ("n-c", "n-b", "n-a"):
        db_session.execute(text("INSERT INTO nodes (name, dropped_samples_total, created_at) "
                                "VALUES (:n, 0, now())"), {"n": node})
    for (node, index), rollups in sorted(fleet.items(), reverse=True):
        gpu_id = db_session.execute(text(
            "INSERT INTO gpus (node_id, uuid, index, name, healthy) SELECT id, :u, :i, 'H100', true FROM nodes "
            "WHERE name = :n RETURNING id"), {"n": node, "i": index, "u": f"GPU-{node}-{index}"}).scalar_one()
        for back, (util, energy, source) in rollups.items():
            db_session.execute(text(
                "INSERT INTO gpu_hourly (gpu_id, hour, samples, covered_s, busy_s, util_busy_s, energy_j, "
                "memory_peak_bytes, util_mean_pct, energy_source) VALUES (:g, to_timestamp(:h), 720, 3600, "
                "1800, 1500, :e, 4e10, :u, :s)"),
                {"g": gpu_id, "h": h - back * HOUR_S, "e": energy, "u": util, "s": source})
    db_session.commit()

    t = api.get("/api/v1/fleet/timeline", params={"window": "24h"}, headers=auth(make_token("operator"))).json()

    expected = _expected(fleet, h, window_hours=24, max_rows=3)
    for key, value in expected.items():
        assert t[key] == (pytest.approx(value) if key.startswith("energy_j") else value), key
    assert t["energy_by_source_j"].keys() == expected["energy_by_source_j"].keys()
    for source, values in expected["energy_by_source_j"].items():
        assert t["energy_by_source_j"][source] == [None if v is None else pytest.approx(v) for v in values]
    # The cases the fleet was built for, spelled out.
    assert t["truncated"] is True and [(g["node"], g["index"]) for g in t["gpus"]] == [("n-a", 0), ("n-a", 1),
                                                                                        ("n-b", 0)]
    assert t["gpu_util_mean_pct"][1] == [65.0, None, 55.0]  # n-a/1 had no rollup at hour -2: null, not 0
    assert t["energy_source"] == ["hardware_counter", "mixed", "mixed"]  # hour -3: n-b/0 had no energy
    assert t["energy_gpus"] == [2, 3, 3] and t["energy_j"][0] == pytest.approx(7.0e6)


def _expected(fleet: dict[tuple[str, int], dict[int, tuple[float | None, float | None, str | None]]], h: int, *,
              window_hours: int, max_rows: int) -> dict[str, Any]:
    """The timeline, cell by cell from the rollups as inserted."""
    in_window = {key: {h - back * HOUR_S: v for back, v in rollups.items() if back <= window_hours}
                 for key, rollups in fleet.items()}
    in_window = {key: rollups for key, rollups in in_window.items() if rollups}
    hours = sorted({hour for rollups in in_window.values() for hour in rollups})
    gpus = sorted(in_window)
    energy: list[float | None] = []
    counts: list[int] = []
    by_source: dict[str, list[float | None]] = {}
    for c, hour in enumerate(hours):
        cells = [rollups[hour] for rollups in in_window.values() if hour in rollups and rollups[hour][1] is not None]
        energy.append(sum(e for _, e, _ in cells) if cells else None)  # type: ignore[misc]
        counts.append(len(cells))
        for _, e, source in cells:
            values = by_source.setdefault(source or "unrecorded", [None] * len(hours))
            values[c] = (values[c] or 0.0) + e  # type: ignore[operator]
    return {
        "hours": [float(hour) for hour in hours],
        "gpus": [{"node": n, "index": i, "uuid": f"GPU-{n}-{i}"} for n, i in gpus[:max_rows]],
        "gpu_util_mean_pct": [[in_window[g][hour][0] if hour in in_window[g] else None for hour in hours]
                              for g in gpus[:max_rows]],
        "truncated": len(gpus) > max_rows,
        "energy_j": energy, "energy_gpus": counts, "energy_by_source_j": by_source,
        "energy_source": ["mixed" if len({s for s, v in by_source.items() if v[c] is not None}) > 1
                          else next((s for s, v in by_source.items() if v[c] is not None), None)
                          for c in range(len(hours))],
    }


def test_timeline_of_a_window_without_rollups(api, make_token) -> None:  # type: ignore[no-untyped-def]
    t = api.get("/api/v1/fleet/timeline", params={"window": "7d"}, headers=auth(make_token("operator"))).json()
    assert {k: t[k] for k in ("hours", "gpus", "gpu_util_mean_pct", "truncated", "energy_j", "energy_gpus",
                              "energy_by_source_j", "energy_source")} == {
        "hours": [], "gpus": [], "gpu_util_mean_pct": [], "truncated": False, "energy_j": [], "energy_gpus": [],
        "energy_by_source_j": {}, "energy_source": []}


def test_embedded_mode_gives_the_same_timeline(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """SQLite (`fleetprof up`) has no arrays nor FILTER: its own grouping must give the same answer."""
    from server.auth.service import Principal
    from server.config import ServerSettings
    from server.db import make_engine, make_sessionmaker, session_scope
    from server.fleet import dashboard_router
    from server.migrate import upgrade
    from server.models import Gpu, GpuHourly, Node
    from server.models.base import from_epoch

    monkeypatch.setattr(dashboard_router, "MAX_HEATMAP_ROWS", 3)
    settings = ServerSettings(database_url=f"sqlite:///{tmp_path / 'embedded.db'}")
    upgrade(settings)
    engine = make_engine(settings)
    h = int(time.time() // HOUR_S) * HOUR_S
    try:
        with session_scope(make_sessionmaker(engine)) as session:
            nodes = {n: Node(name=n, dropped_samples_total=0) for n in ("n-c", "n-b", "n-a")}
            session.add_all(nodes.values())
            session.flush()
            for (node, index), rollups in sorted(FLEET.items(), reverse=True):
                gpu = Gpu(node_id=nodes[node].id, uuid=f"GPU-{node}-{index}", index=index, name="H100", healthy=True)
                session.add(gpu)
                session.flush()
                for back, (util, energy, source) in rollups.items():
                    session.add(GpuHourly(gpu_id=gpu.id, hour=from_epoch(h - back * HOUR_S), samples=720,
                                          covered_s=3600, busy_s=1800, util_busy_s=1500, energy_j=energy,
                                          memory_peak_bytes=4e10, util_mean_pct=util, energy_source=source))
        with session_scope(make_sessionmaker(engine)) as session:
            answer = dashboard_router.fleet_timeline(Principal(0, "operator", None, None), session, window="24h")
            t = json.loads(answer.body)
    finally:
        engine.dispose()
    expected = _expected(FLEET, h, window_hours=24, max_rows=3)
    for key, value in expected.items():
        assert t[key] == (pytest.approx(value) if key.startswith("energy_j") else value), key
