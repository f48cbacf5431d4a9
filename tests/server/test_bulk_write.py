"""The bulk write under ingest: binary COPY payloads read back from the real Postgres, the conflict fallback."""

from __future__ import annotations

import pytest

from server.models import Gpu, GpuSample, Node
from server.models.base import epoch_us
from server.storage import pgcopy
from server.storage.bulk import insert_ignore
from tests.server.helpers import auth, gz, sample_batch

TYPES = ["bigint", "timestamptz", "boolean", "bigint", "float", "integer"]


@pytest.fixture
def raw(clean_db):
    conn = clean_db.raw_connection()
    cur = conn.cursor()
    cur.execute("CREATE TEMP TABLE copy_probe (a bigint, ts timestamptz, ok boolean, m bigint, f float, i integer)")
    yield cur
    conn.rollback()
    conn.close()


def _copy(cur, columns) -> list[tuple]:
    import io

    cur.copy_expert("COPY copy_probe FROM STDIN (FORMAT binary)", io.BytesIO(pgcopy.encode(TYPES, columns)))
    cur.execute("SELECT a, (extract(epoch FROM ts) * 1000000)::bigint, ok, m, f, i FROM copy_probe ORDER BY a")
    return cur.fetchall()


def test_rows_with_mixed_null_patterns_read_back_exactly(raw):
    # Four NULL patterns in one payload (rows are grouped by pattern), values at the edges of their types.
    ts = [1_700_000_000.0000005, 1_700_000_000.0000015, 946_684_800.0, 4_102_444_799.999999]
    columns = [
        [0, 1, 2, 3],
        ts,
        [True, None, False, None],
        [2**63 - 1, None, 0, 85_520_809_984],
        [0.1, 1e308, None, None],
        [2**31 - 1, -(2**31), None, 7],
    ]
    rows = _copy(raw, columns)
    assert [r[0] for r in rows] == [0, 1, 2, 3]
    # Microseconds rounded as Postgres' to_timestamp rounds them (half to even), i.e. server.models.base.epoch_us.
    assert [r[1] for r in rows] == [epoch_us(t) for t in ts]
    raw.execute("SELECT (extract(epoch FROM to_timestamp(%s)) * 1000000)::bigint", (ts[0],))
    assert rows[0][1] == raw.fetchone()[0]
    assert [r[2] for r in rows] == [True, None, False, None]
    assert [r[3] for r in rows] == [2**63 - 1, None, 0, 85_520_809_984]
    assert [r[4] for r in rows] == [0.1, 1e308, None, None]
    assert [r[5] for r in rows] == [2**31 - 1, -(2**31), None, 7]


@pytest.mark.parametrize("column, value", [(3, 2**63), (5, 2**31), (0, "x")])
def test_values_a_fixed_size_field_cannot_hold_are_refused(column, value):
    columns = [[1], [1_700_000_000.0], [True], [1], [1.0], [1]]
    columns[column] = [value]
    with pytest.raises(pgcopy.NotEncodable):
        pgcopy.encode(TYPES, columns)


def test_text_columns_are_not_encoded():
    with pytest.raises(pgcopy.NotEncodable, match="varchar"):
        pgcopy.encode(["varchar"], [["a"]])


@pytest.fixture
def gpu_id(clean_db, db_session) -> int:
    node = Node(name="bulk-node", dropped_samples_total=0)
    db_session.add(node)
    db_session.flush()
    gpu = Gpu(node_id=node.id, uuid="GPU-bulk-0", index=0, name="NVIDIA H100 80GB HBM3", healthy=True)
    db_session.add(gpu)
    db_session.commit()
    return gpu.id


def test_a_group_meeting_stored_rows_keeps_them_and_adds_the_rest(db_session, gpu_id):
    t0 = 1_780_000_000.0
    names = ["gpu_id", "ts", "memory_used_bytes"]
    assert insert_ignore(db_session, GpuSample.__table__, names, [[gpu_id] * 3, [t0, t0 + 1, t0 + 2], [1, 2, 3]]) == 3
    # Two of these are stored already: the binary COPY fails on them, the savepoint fallback skips them.
    n = insert_ignore(db_session, GpuSample.__table__, names,
                      [[gpu_id] * 4, [t0 + 1, t0 + 2, t0 + 3, t0 + 4], [20, 30, 40, 50]])
    assert n == 2
    db_session.commit()
    got = db_session.execute(GpuSample.__table__.select().order_by(GpuSample.ts)).all()
    assert [r.memory_used_bytes for r in got] == [1, 2, 3, 40, 50]  # the first write wins, nothing duplicated


def test_a_value_postgres_refuses_is_the_clients_error_and_loses_nothing(api, make_token):
    # orjson reads integers up to 2^64 - 1; past bigint the binary encoder declines, the INSERT path runs and
    # Postgres refuses the value: 422 naming it, and a good batch from the same node is stored all the same.
    token = make_token("agent", node="node-a")
    bad = sample_batch(seq=0, n=2, gpus=1)
    bad["samples"]["memory_used_bytes"] = [2**64 - 1, 1]
    r = api.post("/api/v1/ingest/samples", content=gz(bad), headers={**auth(token), "Content-Encoding": "gzip"})
    assert r.status_code == 422 and "cannot be stored" in r.json()["detail"], r.text
    good = sample_batch(seq=1, n=2, gpus=1)
    r = api.post("/api/v1/ingest/samples", content=gz(good), headers={**auth(token), "Content-Encoding": "gzip"})
    assert r.status_code == 200 and r.json()["accepted"] == 2, r.text


def test_float_rows_by_binary_copy_equals_the_rows_with_nulls_as_nan(pg_engine):
    """server.db.float_rows (binary COPY on Postgres) returns exactly what the driver returns row by row,
    null as NaN, in the statement's order; an empty result is an empty (0, n) array."""
    import numpy as np
    from sqlalchemy import column, select, table, text
    from sqlalchemy.orm import Session

    from server.db import float_rows

    with pg_engine.begin() as conn:
        conn.execute(text("CREATE TEMP TABLE ft (k bigint, x double precision, n integer, b bigint)"))
        conn.execute(text("INSERT INTO ft VALUES (3, 0.1, NULL, 9007199254740993), (1, -2.5e300, 7, NULL), "
                          "(2, NULL, -1, 0)"))
        session = Session(bind=conn)
        ft = table("ft", column("k"), column("x"), column("n"), column("b"))
        stmt = select(ft.c.k, ft.c.x, ft.c.n, ft.c.b).order_by(ft.c.k)
        got = float_rows(session, stmt, 4)
        expected = np.array(session.execute(stmt).all(), dtype=np.float64)
        assert got.shape == (3, 4) and np.array_equal(got, expected, equal_nan=True)
        assert list(got[:, 0]) == [1.0, 2.0, 3.0] and np.isnan(got[1, 1]) and np.isnan(got[0, 3])
        assert float_rows(session, stmt.where(ft.c.k > 5), 4).shape == (0, 4)
        conn.execute(text("DROP TABLE ft"))
