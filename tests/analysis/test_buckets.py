"""The plot bucket grid (server.analysis.base.buckets): merged fine buckets are exactly the buckets of the coarser width,
each budget gets at most its points, and the extremes survive."""

from __future__ import annotations

import numpy as np
import pytest

from server.analysis.base.buckets import FINE_BUCKETS, SLACK_US, Buckets, bucket_factors, fine_width_us, merged_points


def _buckets(ts_us: np.ndarray, values: np.ndarray, start_us: int, width_us: int) -> Buckets:
    """Brute force, one bucket at a time: what the SQL grouping computes."""
    keys = (ts_us - start_us) // width_us
    index, first, last, count, lo, hi = [], [], [], [], [], []
    for key in np.unique(keys):
        sel = keys == key
        v = values[sel]
        index.append(key)
        first.append(ts_us[sel].min() / 1e6)
        last.append(ts_us[sel].max() / 1e6)
        count.append(int((~np.isnan(v)).sum()))
        lo.append(np.nanmin(v) if count[-1] else np.nan)
        hi.append(np.nanmax(v) if count[-1] else np.nan)
    return Buckets(np.array(index), np.array(first), np.array(last), np.array(count), [np.array(lo)], [np.array(hi)])


@pytest.mark.parametrize("points", [10, 37, 500, 1000, 2500])
def test_merging_fine_buckets_gives_the_coarse_buckets_exactly(points: int) -> None:
    rng = np.random.default_rng(points)
    start_us = 1_700_000_000_000_000
    span_s = 86_400.0
    ts_us = np.sort(start_us + rng.integers(0, int(span_s * 1e6), 50_000))
    values = rng.normal(size=ts_us.size)
    values[rng.random(ts_us.size) < 0.1] = np.nan  # gaps: a metric missing in some samples
    fine_us = fine_width_us(span_s)
    factor = bucket_factors({"m": points})["m"]

    merged_ts, (merged,) = merged_points(_buckets(ts_us, values, start_us, fine_us), factor)
    direct_ts, (direct,) = merged_points(_buckets(ts_us, values, start_us, factor * fine_us), 1)

    assert np.array_equal(merged_ts, direct_ts) and np.array_equal(merged, direct)
    assert merged.size <= points and merged.size >= 0.6 * points  # at most the budget, not far below it
    assert merged.max() == np.nanmax(values) and merged.min() == np.nanmin(values)
    assert np.all(np.diff(merged_ts) >= 0)


def test_budgets_of_one_request_share_the_finest_grid() -> None:
    factors = bucket_factors({"memory": 2500, "power": 1000, "util": 1000})
    assert factors["memory"] == -(-FINE_BUCKETS // 1250)
    assert all(f % factors["memory"] == 0 for f in factors.values())
    assert FINE_BUCKETS / factors["power"] <= 500  # still within its own budget
    assert bucket_factors({"steps": 5000})["steps"] == 2  # the same rule, whatever the name


def test_the_span_with_its_slack_on_both_sides_fits_the_grid() -> None:
    for span_s in (0.0, 1.0, 599.0, 86_400.0, 7 * 86_400.0):
        assert (int(span_s * 1e6) + SLACK_US) // fine_width_us(span_s) < FINE_BUCKETS


def test_a_bucket_with_one_row_is_one_point_and_all_null_columns_stay_null() -> None:
    b = Buckets(index=np.array([0, 1, 5]), first_s=np.array([0.0, 1.0, 5.0]), last_s=np.array([0.5, 1.0, 5.9]),
                count=np.array([2, 1, 3]), low=[np.array([1.0, 7.0, 2.0]), np.array([np.nan, np.nan, 4.0])],
                high=[np.array([3.0, 7.0, 9.0]), np.array([np.nan, np.nan, 6.0])])
    ts, (a, c) = merged_points(b, 1)
    assert ts.tolist() == [0.0, 0.5, 1.0, 5.0, 5.9]  # the one-row bucket: one point
    assert a.tolist() == [1.0, 3.0, 7.0, 2.0, 9.0]
    assert np.isnan(c[:3]).all() and c[3:].tolist() == [4.0, 6.0]
    ts, (a, _) = merged_points(b, 2)  # buckets 0 and 1 merge, 5 stays alone
    assert ts.tolist() == [0.0, 1.0, 5.0, 5.9] and a.tolist() == [1.0, 7.0, 2.0, 9.0]
    empty = merged_points(Buckets(np.array([3]), np.array([1.0]), np.array([1.0]), np.array([0]),
                                  [np.array([np.nan])], [np.array([np.nan])]), 4)
    assert empty[0].size == 0 and empty[1][0].size == 0
