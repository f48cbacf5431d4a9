"""The fleet's "GPUs needing attention" (`server.nodes.attention.gpus_needing_attention`, read by the fleet summary
and `GET /api/v1/gpus?node=N`) on a 1 Hz fleet whose health counters are read every 30th sample, as the agent reads
them (null between): wall time of the product's probes (one first/last pair for the fields of every sample, one for
the health counters, each finding the sample that read them) against the single null-blind pair it replaced (which
missed the counters whenever the window's first or last sample was not a health reading: 29 times in 30).

On a database of its own (dropped at the end), migrated with the real migrations: --gpus GPUs on 8-GPU nodes, one
hour of raw samples at 1 Hz (generated in SQL, the columns of bench/storage_plans.py plus the health counters); one
GPU in 100 has its PCIe replay counter rise half-way, so the answer is checked too.

    .venv/bin/python bench/attention_probes.py [--gpus 1000] [--repeat 5]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

from sqlalchemy import create_engine, text

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.report import write_report  # noqa: E402
from bench.scratch import insert_h100_nodes, scratch_database  # noqa: E402
from bench.storage_plans import GPUS_PER_NODE, SAMPLE_COLUMNS, SAMPLE_VALUES  # noqa: E402
from server.config import ServerSettings  # noqa: E402
from server.db import make_engine, make_sessionmaker, session_scope  # noqa: E402
from server.migrate import upgrade  # noqa: E402
from server.nodes import attention  # noqa: E402
from server.storage.partitions import PARTITIONS, day_of  # noqa: E402

HOUR_S = 3600
HEALTH_EVERY = 30
HEALTH_COLUMNS = ("ecc_corrected_volatile, ecc_uncorrected_volatile, retired_pages_sbe, retired_pages_dbe, "
                  "retired_pages_pending, remapped_rows_correctable, remapped_rows_uncorrectable, "
                  "remapped_rows_pending, remapped_rows_failed, pcie_replay_total, nvlink_errors_total")
# read every 30th sample (staggered by GPU); GPU g % 100 == 0 has 3 PCIe replays from half-way through the hour
HEALTH_VALUES = ", ".join(["CASE WHEN s % 30 = g % 30 THEN 0 END"] * 9 + [
    "CASE WHEN s % 30 = g % 30 THEN (CASE WHEN g % 100 = 0 AND s >= :mid THEN 3 ELSE 0 END) END",
    "CASE WHEN s % 30 = g % 30 THEN 0 END"])


def generate(url: str, gpus: int, now: float) -> int:
    engine = create_engine(url)
    start = int(now) - HOUR_S
    with engine.begin() as conn:
        insert_h100_nodes(conn, gpus // GPUS_PER_NODE, GPUS_PER_NODE)
    with session_scope(make_sessionmaker(engine)) as session:
        PARTITIONS.ensure(session, sorted({day_of(start), day_of(now)}))
    with engine.begin() as conn:
        rows = conn.execute(text(f"""
            INSERT INTO gpu_samples ({SAMPLE_COLUMNS}, {HEALTH_COLUMNS})
            SELECT {SAMPLE_VALUES}, {HEALTH_VALUES} FROM (
              SELECT g, s, to_timestamp(s) AS ts, (s % 6 < 4)::int AS busy
              FROM generate_series(CAST(:s0 AS bigint), :s0 + :n - 1) s,
                   generate_series(CAST(1 AS bigint), :g1) g) x"""),
            {"s0": start, "n": HOUR_S, "g1": gpus, "mid": start + HOUR_S // 2}).rowcount
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(text("VACUUM ANALYZE"))
    engine.dispose()
    return rows


def timed(url: str, now: float, repeat: int) -> tuple[list[float], dict[str, list[str]]]:
    engine = make_engine(ServerSettings(database_url=url))
    factory = make_sessionmaker(engine)
    times, found = [], {}
    for _ in range(repeat):
        with session_scope(factory) as session:
            t0 = time.perf_counter()
            found = {u: [f.kind for f in fs] for u, fs in
                     attention.gpus_needing_attention(session, now=now, window_s=HOUR_S).items()}
            times.append(time.perf_counter() - t0)
    engine.dispose()
    return times, found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", type=int, default=1000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    with scratch_database("fleetprof_bench_attention") as url:
        upgrade(ServerSettings(database_url=url))
        now = float(int(time.time()))
        t0 = time.perf_counter()
        rows = generate(url, args.gpus, now)
        print(f"generated {rows:,} raw rows ({args.gpus:,} GPUs x 1 h at 1 Hz) in {time.perf_counter() - t0:.0f} s")
        product, found = timed(url, now, args.repeat)
        every = attention.EVERY_SAMPLE
        # the replaced query: one pair of probes over every column, the window's first and last sample whatever null
        attention.EVERY_SAMPLE = tuple(c for g in attention._probe_groups() for c in g)
        try:
            blind, blind_found = timed(url, now, args.repeat)
        finally:
            attention.EVERY_SAMPLE = every
    faulty = args.gpus // 100
    rows_out = [("product probes (2 pairs, health readings)", statistics.median(product), len(found)),
                ("null-blind probes (1 pair, replaced)", statistics.median(blind), len(blind_found))]
    print(f"\n{'query':<44}{'median s':>10}{'GPUs found':>12}   (expected {faulty})")
    for name, seconds, n in rows_out:
        print(f"{name:<44}{seconds:>10.3f}{n:>12}")
    assert len(found) == faulty and all(k == ["pcie_replay"] for k in found.values()), found
    write_report(__file__, {"gpus_count": args.gpus, "raw_rows_count": rows, "faulty_gpus_count": faulty,
                            "product_median_s": statistics.median(product), "product_found_count": len(found),
                            "null_blind_median_s": statistics.median(blind),
                            "null_blind_found_count": len(blind_found), "repeat_count": args.repeat})
    return 0


if __name__ == "__main__":
    sys.exit(main())
