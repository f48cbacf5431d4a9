"""GET /jobs/{id}/plans/offsets and /plans/swap: the plans of a real Kineto memory trace, as a program applies them."""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np

from tests.server.helpers import auth

KINETO = Path(__file__).resolve().parents[1] / "data/kineto"
MEMORY_TRACE = KINETO / "hta/df_index_resolver/df_index_resolver.json.gz"


def _upload(api, token, job, body: bytes, **params):  # type: ignore[no-untyped-def]
    return api.post(f"/api/v1/jobs/{job}/traces", content=body, params=params,
                    headers={**auth(token), "Content-Type": "application/gzip"})


def test_plans_of_an_uploaded_memory_trace(api, make_token):
    team = make_token("team", team="vision")
    r = _upload(api, team, "mem-plans", MEMORY_TRACE.read_bytes(), filename=MEMORY_TRACE.name)
    assert r.status_code == 200, r.text
    assert "plans" not in r.json()["summary"]  # the entries are read from the plans routes, not echoed
    r = api.get("/api/v1/jobs/mem-plans/report", headers=auth(team))
    assert "offset_bytes" not in r.text  # the entries stay out of the report (13,385 of them here)
    report = r.json()
    summary = report["optimization"]["offset_plan"]

    r = api.get("/api/v1/jobs/mem-plans/plans/offsets", headers=auth(team))
    assert r.status_code == 200, r.text
    plan = r.json()
    n = plan["count"]
    assert n == summary["allocations"] > 0 and plan["algorithm"] == summary["algorithm"]
    assert plan["arena_bytes"] == summary["traced_planned_bytes"] and plan["source"].startswith("kineto:")
    assert plan["allocation"] == list(range(n))
    assert plan["module"] is None  # recorded without stacks: which module made a block is unknown
    align = plan["alignment_bytes"]
    size = -(-np.array(plan["size_bytes"], np.int64) // align) * align
    off = np.array(plan["offset_bytes"], np.int64)
    a, f = np.array(plan["alloc_seq"]), np.array(plan["free_seq"])
    assert (off >= 0).all() and (off + size <= plan["arena_bytes"]).all() and (off % align == 0).all()
    # every pair live at the same time ([alloc_seq, free_seq) overlap) is disjoint in [offset, offset + size)
    for lo in range(0, n, 1000):  # rows in chunks: n x n at once is ~180 MB per array
        rows = slice(lo, lo + 1000)
        live_together = (a[rows, None] < f[None, :]) & (a[None, :] < f[rows, None])
        share = (off[rows, None] < off[None, :] + size[None, :]) & (off[None, :] < off[rows, None] + size[rows, None])
        nonempty = (size[rows, None] > 0) & (size[None, :] > 0)
        itself = np.arange(lo, min(lo + 1000, n))[:, None] == np.arange(n)[None, :]
        clash = live_together & share & nonempty & ~itself
        assert not clash.any(), np.argwhere(clash)[:5] + [lo, 0]
    assert max(plan["free_s"]) <= report["optimization"]["swap_plan"]["window_s"] + 1e-9

    r = api.get("/api/v1/jobs/mem-plans/plans/swap", headers=auth(team))
    assert r.status_code == 200, r.text
    swap = r.json()
    assert swap["count"] == report["optimization"]["swap_plan"]["tensors_swapped"] == len(swap["allocation"])
    assert swap["new_peak_bytes"] <= swap["old_peak_bytes"]
    window = swap["window_s"]
    assert window > 0
    # built on the trace's iteration structure: its 5 ProfilerStep spans (~0.34 s each)
    bounds = swap["step_boundaries_s"]
    assert len(bounds) == 6 and bounds == sorted(bounds) and bounds[1] > 0  # the first step began before the window
    assert "step" in swap["candidate_rule"] and 0.3 < swap["step_time_s"] < 0.4
    assert swap["count"] > 0 and all(s is not None for s in swap["step"]) and all(swap["within_step"])
    for k in range(swap["count"]):
        times = [swap[c][k] for c in ("alloc_s", "offload_start_s", "offload_end_s", "prefetch_start_s",
                                      "prefetch_end_s", "free_s")]
        assert all(0 <= t <= window + 1e-9 for t in times), times  # inside the trace
        assert times == sorted(times), times  # offload after the write, prefetch back before the free
        step = swap["step"][k]
        assert bounds[step] <= times[1] and times[-2] <= bounds[step + 1]  # both copies inside the step
        i = swap["allocation"][k]
        assert swap["size_bytes"][k] == plan["size_bytes"][i]  # the same allocation index as the offset plan


def test_no_plan_without_a_memory_trace_and_other_teams_see_nothing(api, make_token):
    team, other = make_token("team", team="vision"), make_token("team", team="nlp")
    operator = make_token("operator")
    body = gzip.compress(b'{"traceEvents": [{"ph": "X", "name": "k", "ts": 1, "dur": 2, "pid": 0, "tid": 0}]}')
    assert _upload(api, team, "no-mem", body).status_code == 200
    for which in ("offsets", "swap"):
        r = api.get(f"/api/v1/jobs/no-mem/plans/{which}", headers=auth(team))
        assert r.status_code == 404 and "allocation trace" in r.json()["detail"], r.text
    r = _upload(api, team, "mem-2", MEMORY_TRACE.read_bytes(), filename=MEMORY_TRACE.name)
    assert r.status_code == 200, r.text
    assert api.get("/api/v1/jobs/mem-2/plans/swap", headers=auth(other)).status_code == 404
    assert api.get("/api/v1/jobs/mem-2/plans/offsets", headers=auth(operator)).status_code == 200
    assert api.get("/api/v1/jobs/nope/plans/offsets", headers=auth(team)).json()["detail"] == "job 'nope' not found"


def test_allocations_are_named_by_the_module_that_made_them(api, make_token):
    """A trace recorded with_stack=True (Qwen1.5-0.5B on an H100): each allocation names its top-level module."""
    team = make_token("team", team="vision")
    path = KINETO / "tracelens/h100/Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz"
    assert _upload(api, team, "qwen", path.read_bytes(), filename=path.name).status_code == 200
    plan = api.get("/api/v1/jobs/qwen/plans/offsets", headers=auth(team)).json()
    modules = plan["module"]
    assert len(modules) == plan["count"] > 0
    named = [m for m in modules if m is not None]
    assert len(named) > plan["count"] // 2
    # the 24 decoder layers each allocate the same blocks in the forward
    layers = {m for m in named if m.startswith("Qwen2DecoderLayer_")}
    assert len(layers) == 24 and len({named.count(m) for m in layers}) == 1
    swap = api.get("/api/v1/jobs/qwen/plans/swap", headers=auth(team)).json()
    assert len(swap["module"]) == swap["count"]


def test_the_sdk_reads_the_plans(live_server, make_token):
    """fleetprof.client.Client through a real server: the plans of a small memory trace, 404 without one."""
    import pytest

    from fleetprof.client import ApiError, Client
    from tests.security.test_access_matrix import KINETO as SMALL_MEMORY_TRACE  # two 2 MiB blocks, overlapping

    with Client(live_server, make_token("team", team="vision")) as api:
        api.upload_trace("sdk-plans", gzip.compress(SMALL_MEMORY_TRACE), filename="small.json")
        plan = api.offset_plan("sdk-plans")
        assert plan["count"] == 2 and sorted(plan["offset_bytes"]) == [0, 2 << 20] and plan["arena_bytes"] == 4 << 20
        assert api.swap_plan("sdk-plans")["count"] == 0  # 20 us idle: no copy of 2 MiB hides in it
        api.upload_trace("sdk-none", gzip.compress(b'{"traceEvents": []}'), filename="empty.json")
        with pytest.raises(ApiError) as err:
            api.swap_plan("sdk-none")
        assert err.value.status == 404 and "allocation trace" in err.value.detail
