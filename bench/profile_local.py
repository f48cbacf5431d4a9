"""What `fleetprof.profile()` in local mode costs a program: the time to start the in-process collector (first block
of a process: server imports, SQLite migrations, uvicorn) and to finish (flush the hooks, characterize, write JSON
and HTML), in fresh interpreters running a real PyTorch CPU loop. Prints a table and writes bench/out/profile_local.json.

    PYTHONPATH=. .venv/bin/python bench/profile_local.py [--runs 5] [--steps 200]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from bench.report import write_report

CHILD = """
import json, sys, time
import torch
import fleetprof
model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
t0 = time.perf_counter()
block = fleetprof.profile(name="bench", output_dir=sys.argv[2])
block.__enter__()
t1 = time.perf_counter()
for _ in range(int(sys.argv[1])):
    model(torch.randn(32, 64)).pow(2).mean().backward()
    opt.step()
    opt.zero_grad()
t2 = time.perf_counter()
block.__exit__(None, None, None)
t3 = time.perf_counter()
print(json.dumps({"start_s": t1 - t0, "loop_s": t2 - t1, "finish_s": t3 - t2,
                  "steps": block.result.report["time"]["steps"]}))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--steps", type=int, default=200)
    args = parser.parse_args()
    root = Path(__file__).resolve().parents[1]
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEETPROF_")}
    env["PYTHONPATH"] = str(root)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(args.runs):
            out = subprocess.run([sys.executable, "-c", CHILD, str(args.steps), tmp], env=env, capture_output=True,
                                 text=True, check=True)
            rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
    assert all(r["steps"] == args.steps for r in rows), rows
    figures = {"runs_count": args.runs, "steps_count": args.steps,
               "start_median_s": statistics.median(r["start_s"] for r in rows),
               "start_max_s": max(r["start_s"] for r in rows),
               "finish_median_s": statistics.median(r["finish_s"] for r in rows),
               "finish_max_s": max(r["finish_s"] for r in rows),
               "loop_median_s": statistics.median(r["loop_s"] for r in rows),
               "report_steps_match_ok": True}
    print(f"{'figure':<22}{'value':>10}")
    for key, value in figures.items():
        print(f"{key:<22}{value:>10.3f}" if isinstance(value, float) else f"{key:<22}{value!s:>10}")
    print(f"wrote {write_report(__file__, figures)}")


if __name__ == "__main__":
    main()
