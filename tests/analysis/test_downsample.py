from __future__ import annotations

import numpy as np
import pandas as pd
from hypothesis import given, settings
from hypothesis import strategies as st

from server.analysis.base.downsample import downsample


def test_keeps_global_extremes_of_real_cluster_series(real_data):
    # A month of per-minute running-GPU counts from the Helios cluster: spiky, with flat stretches.
    seq = pd.read_csv(real_data / "cluster/helios/analysis/2_cluster characterization/Earth_vcs/vc3sl/"
                      "cluster_sequence_vc.csv")
    ts = pd.to_datetime(seq["time"]).to_numpy().astype("datetime64[s]").astype("int64").astype(float)
    v = seq["running_gpu_num"].to_numpy(dtype=float)
    t_d, v_d = downsample(ts, v, 500)
    assert len(v_d) <= 500
    assert v_d.max() == v.max() and v_d.min() == v.min()
    assert np.all(np.diff(t_d) > 0)
    # Every kept point is a real sample, not an average.
    lookup = dict(zip(ts, v))
    assert all(lookup[t] == x for t, x in zip(t_d, v_d))


def test_short_series_and_nans():
    ts = np.arange(5.0)
    v = np.array([1.0, np.nan, 3.0, 2.0, 0.5])
    t_d, v_d = downsample(ts, v, 100)
    assert t_d.tolist() == [0.0, 2.0, 3.0, 4.0]
    assert v_d.tolist() == [1.0, 3.0, 2.0, 0.5]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(-1e12, 1e12), min_size=1, max_size=400), st.integers(1, 50))
def test_property_extremes_and_bound(values, n_points):
    v = np.array(values)
    ts = np.arange(v.size, dtype=float)
    t_d, v_d = downsample(ts, v, n_points)
    assert len(v_d) <= max(2, n_points) or len(v_d) == v.size
    assert v_d.max() == v.max() and v_d.min() == v.min()
    assert np.all(np.diff(t_d) > 0)


def test_indices_keep_ends_and_extremes_for_trace_memory():
    # the Kineto memory timeline indexes three columns at once, so it takes indices, first and last kept
    from server.analysis.base.downsample import minmax_indices

    rng = np.random.default_rng(0)
    v = np.cumsum(rng.integers(-5, 6, 10_001)).astype(np.int64)
    idx = minmax_indices(v, 100, keep_ends=True)
    assert len(idx) <= 102 and idx[0] == 0 and idx[-1] == len(v) - 1
    assert np.all(np.diff(idx) > 0)
    assert v[idx].max() == v.max() and v[idx].min() == v.min()
    assert minmax_indices(v[:50], 100).tolist() == list(range(50))
