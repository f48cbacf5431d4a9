"""The typed report keeps every figure: characterize fixed real inputs and compare with the JSON the untyped
code produced (written once from commit 76a4454, before the report had a type; regenerate only when a figure's
definition changes on purpose, with ANALYZER_VERSION: version 3 added processes[].whose and no other change; version 4 the power-cap advice names `fleetprof tune power` and lists the runs measured; version 5 added the health
section, the mfu section, their sources, and time.stragglers.gpus/source, NVML-only stragglers; version 6 added
utilization.gpm and sources["utilization.gpm"], unknown for these pre-Hopper captures, and traces.kineto.per_rank[]
format and scopes (issue #22), and no other change)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from server.analysis.base.jobdata import JobData, ProcessPeak
from server.analysis.characterize import characterize
from server.analysis.traces.kineto import summarize_trace
from server.analysis.traces.sections import merge_trace_sections

from .test_characterize import real_job  # noqa: F401  (the fixture)

GOLDEN = Path(__file__).parent / "golden"
NOW = 1_800_000_000.0


def _cases(job: JobData, real_data: Path) -> dict[str, dict]:
    procs = [ProcessPeak(gpu_uuid="GPU-0", pid=41, job_id=job.job_id, attribution="env",
                         peak_used_bytes=30 * 2**30, first_ts=float(job.gpus[0].ts[0]), last_ts=float(job.gpus[0].ts[-1])),
             ProcessPeak(gpu_uuid="GPU-1", pid=77, job_id=None, attribution=None, peak_used_bytes=None,
                         first_ts=float(job.gpus[1].ts[0]), last_ts=float(job.gpus[1].ts[-1]))]
    finished = JobData(**{**job.__dict__, "processes": procs, "oom_events": 1, "layer_step_s": 1.5})
    running = JobData(**{**job.__dict__, "started_at": float(job.gpus[0].ts[0]) - 30, "state": "running",
                         "steps": None, "layers": []})
    traced = characterize(finished, now=NOW)
    ranks = sorted((real_data / "kineto/hta/trace_filter").glob("sampled_rank-*.json.gz"))
    merge_trace_sections(traced, [summarize_trace(f).to_dict() | {"kind": "kineto", "filename": f.name, "rank": i}
                                  for i, f in enumerate(ranks)])
    return {"finished": characterize(finished, now=NOW), "running": characterize(running, now=NOW),
            "traced": json.loads(json.dumps(traced))}


def test_report_figures_unchanged(real_job, real_data):  # noqa: F811
    got = _cases(real_job, real_data)
    want = json.loads((GOLDEN / "characterize_real_job.json").read_text())
    for case in want:
        assert json.loads(json.dumps(got[case], allow_nan=False)) == want[case], case
    assert np.isfinite(got["finished"]["energy"]["energy_j"])
