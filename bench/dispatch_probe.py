"""Where a small training step's time goes on a real GPU: `python bench/dispatch_probe.py` on a CUDA machine.

For each row of bench/zoo_rows.py at its smallest and largest batch (fp32 AdamW, the canned step of
server/estimate/step.py, real CUDA kernels), one step under torch.profiler (Kineto) gives the CUDA kernels launched
per step and the GPU's busy time (kernel durations summed); timed steps without the profiler give the wall time per
step and the host's share (the Python loop's time before the closing synchronize). A step whose GPU busy time is far
below its wall time is host-bound: its time is kernels x the host's cost per kernel (dispatch, autograd, launch),
which the roofline's launch floor stands for. Prints a table and writes bench/out/dispatch_probe.json.
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from bench.report import write_report  # noqa: E402
from bench.zoo_rows import ROW_SETS, ZooRow  # noqa: E402

TIMED_MIN_S = 1.5


class _NoEmulation:
    autocast_dtype = None

    def __enter__(self) -> _NoEmulation:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def autocast(self):  # type: ignore[no-untyped-def]
        import contextlib

        return contextlib.nullcontext()


def probe(row: ZooRow, batch: int) -> dict[str, Any]:
    from server.estimate.models import resolve
    from server.estimate.schemas import EstimateRequest
    from server.estimate.step import train_steps
    from server.estimate.trace_step import StepSettings, prepare

    request = EstimateRequest.model_validate({**row.body, "batch_size": batch})
    resolved = resolve(request.model, request.inputs, request.seq_len, request.target,
                       registered=(request.model.factory,) if request.model.factory else ())
    model, data, optimizer, _ = prepare(resolved, StepSettings(optimizer="adamw", precision="fp32"), batch,
                                        torch.device("cuda"))
    emu = _NoEmulation()
    train_steps(model, data, optimizer, emu, steps=3)  # type: ignore[arg-type]  # warm: cuDNN/cuBLAS choices made
    torch.cuda.synchronize()
    with tempfile.TemporaryDirectory() as tmp:
        trace_path = Path(tmp) / "trace.json"
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                                torch.profiler.ProfilerActivity.CUDA]) as prof:
            train_steps(model, data, optimizer, emu, steps=1)  # type: ignore[arg-type]
            torch.cuda.synchronize()
        prof.export_chrome_trace(str(trace_path))
        events = json.loads(trace_path.read_text())["traceEvents"]
    kernels = [e for e in events if e.get("cat") == "kernel"]
    busy_s = sum(e.get("dur", 0) for e in kernels) / 1e6
    launches = sum(1 for e in events if e.get("cat") == "cuda_runtime" and "Launch" in e.get("name", ""))
    aten_ops = sum(1 for e in events if e.get("cat") == "cpu_op" and e.get("name", "").startswith("aten::"))
    steps, host_s = 0, 0.0
    t0 = time.perf_counter()
    while steps < 5 or time.perf_counter() - t0 < TIMED_MIN_S:
        h0 = time.perf_counter()
        train_steps(model, data, optimizer, emu, steps=1)  # type: ignore[arg-type]
        host_s += time.perf_counter() - h0
        torch.cuda.synchronize()
        steps += 1
    wall_s = (time.perf_counter() - t0) / steps
    del model, data, optimizer
    torch.cuda.empty_cache()
    return {"kernels_count": len(kernels), "launches_count": launches, "aten_ops_count": aten_ops,
            "gpu_busy_s": busy_s, "step_s": wall_s, "host_s": host_s / steps,
            "host_per_kernel_us": 1e6 * (host_s / steps) / max(len(kernels), 1),
            "gpu_busy_fraction": busy_s / wall_s if wall_s else None}


def main() -> int:
    if not torch.cuda.is_available():
        print("dispatch_probe: no CUDA GPU here: nothing measured", file=sys.stderr)
        return 2
    import argparse

    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", choices=sorted(ROW_SETS), default="zoo")
    args = parser.parse_args()
    rows: dict[str, Any] = {}
    print(f"{'row':32s} {'kernels':>8s} {'aten':>6s} {'GPU busy ms':>12s} {'step ms':>8s} {'host ms':>8s} "
          f"{'host us/kernel':>15s}")
    for row in ROW_SETS[args.rows]():
        for batch in sorted({row.batches[0], row.batches[-1]}):
            r = probe(row, batch)
            name = f"{row.name} batch {batch}"
            rows[name] = r
            print(f"{name:32s} {r['kernels_count']:8d} {r['aten_ops_count']:6d} {1e3 * r['gpu_busy_s']:12.2f} "
                  f"{1e3 * r['step_s']:8.2f} {1e3 * r['host_s']:8.2f} {r['host_per_kernel_us']:15.1f}", flush=True)
    write_report(__file__, {"rows_set": args.rows, "device": torch.cuda.get_device_name(0), "torch": torch.__version__, "rows": rows})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
