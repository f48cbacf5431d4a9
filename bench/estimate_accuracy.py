"""Estimator accuracy on this CPU, over the zoo: the `device: cpu` estimate vs an independent reference, next to
what parameter-only estimators predict for the same rows.

    .venv/bin/python bench/estimate_accuracy.py [--quick] [--only NAME ...] [--out bench/results/estimate_accuracy_cpu.txt]

Rows: every architecture of server/estimate/zoo/catalogue.py x its 3 batch sizes x {fp32, AMP bf16} x {SGD, AdamW}
(`--quick`: a handful of architectures at one batch size).
- ours: the estimate for `device: cpu` (fake CPU tensors), `peak_requested_bytes` (the CPU allocator neither caches
  nor rounds, so the allocated peak is the sum of live tensor sizes);
- measured: server/estimate/reference.py: a plain user loop (zero_grad, autocast('cpu') forward + loss, backward,
  step; the optimizer as users build it), none of the estimator's code, measured by torch.profiler(profile_memory)
  after one warm step;
- accelerate: `accelerate estimate-memory`'s training figure, documented as 4 x the model size in the training
  dtype for Adam (weights + gradients + 2 Adam moments); activations ignored;
- deepspeed: `estimate_zero2_model_states_mem_needs(total_params, num_gpus_per_node=1, cpu_offload=False)`,
  GPU side = 4 x params + 16 x params / gpus bytes (fp16 weights+grads, fp32 master weights and moments).
Error = (prediction - measured) / measured. A negative error is an under-estimate: the job would OOM.
Summary per family and overall: median and p95 of |error|, worst under-estimate. Targets (issue #17) for ours:
median <= 2 %, p95 <= 5 %, no under-estimate beyond -3 %. A row beyond 5 % is listed as a miss; explain one with
`python -m server.estimate.explain ZOO_NAME --batch B --precision P --optimizer O`.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import time
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.report import write_report  # noqa: E402
from server.estimate.reference import measure_reference_peak  # noqa: E402
from server.estimate.trace_step import StepSettings, trace_step  # noqa: E402
from server.estimate.zoo.catalogue import OPTIMIZERS, PRECISIONS, QUICK, ZOO, ZooEntry, architectures  # noqa: E402

MISS = 0.05


def _p95(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]


def summary(errors: list[float]) -> tuple[float, float, float]:
    """(median |error|, p95 |error|, worst under-estimate (most negative error, 0 when none is negative))."""
    magnitudes = [abs(e) for e in errors]
    return statistics.median(magnitudes), _p95(magnitudes), min(0.0, *errors)


def planned_rows(entries: list[ZooEntry], quick: bool) -> list[tuple[ZooEntry, str, str, int]]:
    """Middle batch size first, every architecture, then the others: a run cut short (--max-minutes) still covers
    the whole zoo at one batch size."""
    order = [1] if quick else [1, 0, 2]
    return [(entry, precision, optimizer, entry.batches[i]) for i in order for precision in PRECISIONS
            for optimizer in OPTIMIZERS for entry in entries]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--only", nargs="*", help="zoo names to run")
    parser.add_argument("--max-minutes", type=float, help="start no row after this long; summarise what ran")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    started = time.monotonic()
    entries: list[ZooEntry] = [e for e in ZOO if (not args.only or e.name in args.only)
                               and (not args.quick or e.name in QUICK)]
    header = (f"{'model':26s} {'family':12s} {'prec':8s} {'opt':5s} {'batch':>5s} {'params':>7s} {'measured':>9s} "
              f"{'ours':>9s} {'err':>7s} {'accel':>9s} {'err':>7s} {'dspeed':>9s} {'err':>7s} {'trace_s':>7s}")
    lines = [f"# torch {torch.__version__}, {platform.processor() or platform.machine()}, {architectures()} "
             f"architectures in the zoo, device: cpu, MiB = 2^20 bytes", header, "-" * len(header)]
    out = args.out.open("w") if args.out else None

    def emit(*new: str) -> None:
        print("\n".join(new), flush=True)
        lines.extend(new)
        if out:
            out.write("\n".join(new) + "\n")
            out.flush()

    emit(*lines[:])
    del lines[:3]
    rows: dict[str, dict[str, object]] = {}
    errors: dict[str, dict[str, list[float]]] = {}
    misses: list[str] = []
    failures: list[str] = []
    resolved = {e.name: e.resolve() for e in entries}
    plan = planned_rows(entries, args.quick)
    for entry, precision, optimizer, batch in plan:
        if args.max_minutes and time.monotonic() - started > 60 * args.max_minutes:
            emit(f"# stopped after {args.max_minutes:.0f} min (--max-minutes): {len(rows)} of {len(plan)} rows ran")
            break
        settings = StepSettings(optimizer=optimizer, precision=precision, device="cpu", optimizer_impl="for_loop")
        try:
            t0 = time.monotonic()
            st = trace_step(resolved[entry.name], settings, batch)
            trace_s = time.monotonic() - t0
            measured = measure_reference_peak(resolved[entry.name], optimizer, precision, batch).peak_bytes
        except Exception as exc:  # a row that cannot run is reported, the others still run
            failures.append(f"{entry.name} {precision} {optimizer} batch {batch}: {type(exc).__name__}: {exc}"[:300])
            emit(f"{entry.name:26s} FAILED {failures[-1]}")
            continue
        ours = st.trace.peak_requested_bytes()
        accelerate = 4 * st.parameter_bytes
        deepspeed = 20 * st.parameter_count
        err = {k: (v - measured) / measured for k, v in
               (("ours", ours), ("accelerate", accelerate), ("deepspeed", deepspeed))}
        for key in (entry.family, "overall"):
            for method, e in err.items():
                errors.setdefault(key, {}).setdefault(method, []).append(e)
        line = (f"{entry.name:26s} {entry.family:12s} {precision:8s} {optimizer:5s} {batch:5d} "
                f"{st.parameter_count / 1e6:6.2f}M {measured / 2**20:9.2f} {ours / 2**20:9.2f} "
                f"{100 * err['ours']:+6.2f}% {accelerate / 2**20:9.2f} {100 * err['accelerate']:+6.1f}% "
                f"{deepspeed / 2**20:9.2f} {100 * err['deepspeed']:+6.1f}% {trace_s:7.2f}")
        emit(line)
        if abs(err["ours"]) > MISS:
            misses.append(line)
        rows[f"{entry.name} {precision} {optimizer} batch {batch}"] = {
            "parameters_count": st.parameter_count, "measured_bytes": measured, "ours_bytes": ours,
            "ours_error_fraction": err["ours"], "accelerate_bytes": accelerate,
            "accelerate_error_fraction": err["accelerate"], "deepspeed_bytes": deepspeed,
            "deepspeed_error_fraction": err["deepspeed"], "trace_s": trace_s}
    table = ["", f"{'family':12s} {'rows':>5s}   {'ours: median':>12s} {'p95':>7s} {'worst under':>11s}   "
                 f"{'accelerate: median':>18s} {'p95':>7s} {'worst':>7s}   {'deepspeed: median':>17s} {'p95':>7s} "
                 f"{'worst':>7s}"]
    families: dict[str, dict[str, float]] = {}
    for family in sorted(errors, key=lambda f: (f == "overall", f)):
        per = errors[family]
        cells = []
        for method in ("ours", "accelerate", "deepspeed"):
            med, p95, worst = summary(per[method])
            cells.append(f"{100 * med:11.2f}% {100 * p95:6.2f}% {100 * worst:+10.2f}%")
            families.setdefault(family, {}).update({f"{method}_median_abs_error_fraction": med,
                                                    f"{method}_p95_abs_error_fraction": p95,
                                                    f"{method}_worst_under_fraction": worst})
        table.append(f"{family:12s} {len(per['ours']):5d}   " + "    ".join(cells))
    table += ["", f"misses beyond {100 * MISS:.0f} %: {len(misses)}", *misses,
              "", f"rows that failed: {len(failures)}", *failures]
    emit(*table)
    if out:
        out.close()
    write_report(__file__, {"torch_version": torch.__version__, "architectures_count": architectures(),
                            "rows_count": len(rows), "rows_planned_count": len(plan), "failed_rows_count": len(failures),
                            "families": families, "rows": rows})


if __name__ == "__main__":
    main()
