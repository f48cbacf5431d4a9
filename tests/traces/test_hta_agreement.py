"""Acceptance: our GPU time breakdown against HolisticTraceAnalysis' temporal breakdown on real traces.

HTA (`hta.trace_analysis.TraceAnalysis(trace_dir=...).get_temporal_breakdown()`) reads every `.json` /
`.json.gz` in a directory as one job, one file per rank (rank from `distributedInfo`, 0 when absent),
so each case gets its own directory. HTA is run once per case (module-scoped cache).

Target: within 1 percentage point per category (idle / compute / non-compute) per rank. We follow
HTA's rules (see server/analysis/traces/kineto.py), so most traces agree to the rounding of HTA's 2-decimal
percentages. The one difference on purpose: with sub-microsecond timestamps HTA rounds each activity
to [ceil(start), floor(end)], which turns a kernel shorter than 1 us into a negative length; HTA keeps
it (subtracting from busy time), we count it as zero. On the H100 timesformer trace this moves idle by
0.01 pp; on the Qwen trace it makes HTA's non-compute time negative and HTA fails its own assertion.
"""

from __future__ import annotations

import shutil
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from server.analysis.traces.kineto import summarize_trace

pytestmark = pytest.mark.slow  # HTA takes 1-4 s per trace

TOLERANCE_PP = 1.0

# case id -> trace files under tests/data/kineto ("dlrm" = param's 8 ranks, extracted)
CASES: dict[str, list[str]] = {
    "hta-v100-ddp-memory": ["hta/df_index_resolver/df_index_resolver.json.gz"],
    "hta-a100-16rank-rank0": ["hta/negative_queue_length_values_check/rank0.json.gz"],
    "hta-a100-trace-diff": ["hta/trace_diff/control/control.json.gz"],
    "hta-v100-trace-diff": ["hta/trace_diff/test/test.json.gz"],
    "hta-a100-nccl": ["hta/nccl_parser_config/nccl_data.json.gz"],
    "hta-v100-ns-timestamps": ["hta/ns_resolution_trace/rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz"],
    "hta-128rank-two-sampled": ["hta/trace_filter/sampled_rank-0.json.gz", "hta/trace_filter/sampled_rank-1.json.gz"],
    "param-dlrm-8rank": ["dlrm"],
    "kineto-tb-workers0-a": ["kineto-tb/samples/resnet50_num_workers_0/worker0.1623143089861.pt.trace.json.gz"],
    "kineto-tb-workers0-b": ["kineto-tb/samples/resnet50_num_workers_0/worker0.1623143566756.pt.trace.json.gz"],
    "kineto-tb-workers4-a": ["kineto-tb/samples/resnet50_num_workers_4/worker0.1623212756351.pt.trace.json.gz"],
    "kineto-tb-workers4-b": ["kineto-tb/samples/resnet50_num_workers_4/worker0.1623213129365.pt.trace.json.gz"],
    "tracelens-h100-timesformer": ["tracelens/h100/facebook_timesformer-base-finetuned-k400__1016002.json.gz"],
    "tracelens-b200-eager": ["tracelens/b200/eager_trace.json.gz"],
}

# Traces HTA 0.5 cannot read, and why; we must still give a consistent breakdown.
HTA_FAILS: dict[str, tuple[str, type[BaseException]]] = {
    # sub-us kernels rounded to negative lengths -> `assert non_compute_time >= 0` fails
    "tracelens/h100/Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz": ("negative rounded lengths", AssertionError),
    # correlation ids above 32767 after HTA downcasts the column to int16
    "tracelens/mi300/resnet_act_checkpoint.json.gz": ("int16 downcast", TypeError),
}


def _run_hta(trace_dir: Path) -> dict[int, dict[str, float]]:
    import logging

    from hta.configs.config import logger as hta_logger
    from hta.trace_analysis import TraceAnalysis

    hta_logger.setLevel(logging.ERROR)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        df = TraceAnalysis(trace_dir=str(trace_dir)).get_temporal_breakdown(visualize=False)
    return {
        int(row["rank"]): {
            "idle": float(row["idle_time_pctg"]),
            "compute": float(row["compute_time_pctg"]),
            "non_compute": float(row["non_compute_time_pctg"]),
            "span_us": float(row["kernel_time(us)"]),
        }
        for _, row in df.iterrows()
    }


@pytest.fixture(scope="module")
def case_files(kineto_dir: Path, dlrm_dir: Path) -> Callable[[str], list[Path]]:
    def files(case: str) -> list[Path]:
        out: list[Path] = []
        for rel in CASES[case]:
            out.extend(sorted(dlrm_dir.glob("*.json")) if rel == "dlrm" else [kineto_dir / rel])
        return out

    return files


@pytest.fixture(scope="module")
def hta_result(
    case_files: Callable[[str], list[Path]], tmp_path_factory: pytest.TempPathFactory
) -> Callable[[str], dict[int, dict[str, float]]]:
    cache: dict[str, dict[int, dict[str, float]]] = {}

    def result(case: str) -> dict[int, dict[str, float]]:
        if case not in cache:
            d = tmp_path_factory.mktemp(f"hta-{case}")
            for f in case_files(case):
                shutil.copy(f, d / f.name)
            cache[case] = _run_hta(d)
        return cache[case]

    return result


def _ours(files: list[Path]) -> dict[int, Any]:
    out = {}
    for f in files:
        s = summarize_trace(f)
        out[s.rank if s.rank is not None else 0] = s.gpu_time
    return out


@pytest.mark.parametrize("case", sorted(CASES))
def test_breakdown_within_one_point_of_hta(
    case: str,
    case_files: Callable[[str], list[Path]],
    hta_result: Callable[[str], dict[int, dict[str, float]]],
) -> None:
    theirs = hta_result(case)
    ours = _ours(case_files(case))
    assert sorted(ours) == sorted(theirs)
    for rank, h in theirs.items():
        g = ours[rank]
        assert g is not None, f"rank {rank}: we found no GPU activity, HTA did"
        assert g.span_us == pytest.approx(h["span_us"], abs=1.0), f"rank {rank}: span"
        for cat, mine in (("idle", g.idle_pct), ("compute", g.compute_pct), ("non_compute", g.non_compute_pct)):
            assert abs(mine - h[cat]) <= TOLERANCE_PP, f"rank {rank} {cat}: ours {mine:.2f} vs HTA {h[cat]:.2f}"


@pytest.mark.parametrize("rel", sorted(HTA_FAILS))
def test_traces_hta_cannot_read_still_get_a_consistent_breakdown(
    rel: str, kineto_dir: Path, tmp_path: Path
) -> None:
    why, error = HTA_FAILS[rel]
    shutil.copy(kineto_dir / rel, tmp_path / Path(rel).name)
    with pytest.raises(error):
        _run_hta(tmp_path)  # if HTA learns to read it, move the trace to CASES
    g = summarize_trace(kineto_dir / rel).gpu_time
    assert g is not None, why
    parts = (g.idle_us, g.compute_us, g.communication_us, g.memcpy_us, g.memset_us, g.other_us)
    assert min(parts) >= 0
    assert sum(parts) == pytest.approx(g.span_us)
    assert g.idle_pct + g.compute_pct + g.non_compute_pct == pytest.approx(100)
