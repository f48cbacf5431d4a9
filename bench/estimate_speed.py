"""How long an estimate takes, largest-batch search included, for models up to 7 B parameters (target: <= 10 s).

    .venv/bin/python bench/estimate_speed.py [--gpu H100-80GB ...] [--out bench/results/estimate_speed_cpu.txt]

Per row of bench/zoo_rows.py:large_rows(): one estimate (server.estimate.service.estimate, in this process, on
the meta device: no weights), AdamW, bf16 autocast, every GPU of the catalogue unless --gpu narrows it, the
largest-batch search on. The process is warm: one small estimate of the same model type first, so the figure is
the estimate and not Python importing `transformers.models.llama` (that first import, seconds, is paid once per
worker; `cold_first_estimate_cpu_s` is measured for the first row in a fresh interpreter and shown apart).
The target is checked on `cpu_s`, the process's CPU time: the estimate is single-threaded, so on an idle machine
it is the wall time, and on this shared 2-core machine (other builds running) the wall time (`estimate_s`, also
shown) is inflated by the load, not by the estimate.
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.report import write_report  # noqa: E402
from bench.zoo_rows import ZooRow, large_rows  # noqa: E402
from server.estimate.schemas import EstimateRequest  # noqa: E402
from server.estimate.service import estimate  # noqa: E402

TARGET_S = 10.0
SEARCH_BUDGET_S = 600.0  # generous: the figure is how long the search takes (this machine is shared), not a cut


def _request(row: ZooRow, batch: int, gpus: list[str] | None) -> EstimateRequest:
    return EstimateRequest.model_validate({**row.body, "batch_size": batch, "precision": "amp_bf16",
                                           "optimizer": "adamw", "gpu_types": gpus})


def _warm_up(row: ZooRow) -> None:
    """A tiny estimate of the same model type: imports its modeling code and fills PyTorch's own caches."""
    model = dict(row.body["model"])
    if "hf_config" in model:
        cfg = dict(model["hf_config"])
        small = {"num_hidden_layers": 1, "n_layer": 1, "num_layers": 1, "hidden_size": 64, "n_embd": 64,
                 "intermediate_size": 128, "num_attention_heads": 4, "n_head": 4, "num_key_value_heads": 4}
        model["hf_config"] = {**cfg, **{k: v for k, v in small.items() if k in cfg}}
    body = {**row.body, "model": model, "batch_size": 1, "gpu_types": ["T4"], "search_max_batch": False}
    if "seq_len" in body:
        body["seq_len"] = 16
    estimate(EstimateRequest.model_validate(body))


def _cold(row: ZooRow, batch: int, gpus: list[str] | None) -> float:
    """CPU seconds of a fresh interpreter's first estimate, imports of torch and transformers included."""
    code = ("import json, sys, time; t = time.process_time(); import torch; torch.set_num_threads(1); "
            "from server.estimate.schemas import EstimateRequest; from server.estimate.service import estimate; "
            "estimate(EstimateRequest.model_validate(json.loads(sys.argv[1])), search_budget_s=600.0); "
            "print(time.process_time() - t)")
    body = json.dumps(_request(row, batch, gpus).model_dump(mode="json"))
    r = subprocess.run([sys.executable, "-c", code, body], capture_output=True, text=True, timeout=600,
                       cwd=Path(__file__).resolve().parents[1], check=True)
    return float(r.stdout.strip().splitlines()[-1])


def _max_batch(fit: object) -> str:
    """The searched batch ('+': the search ran out of time, a lower bound); 0 = batch 1 does not fit."""
    value = getattr(fit, "max_batch_size", None)
    return "-" if value is None else f"{value}{'' if getattr(fit, 'max_batch_size_exact', False) else '+'}"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--gpu", action="append", dest="gpus", help="GPU types (default: the whole catalogue)")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--no-cold", action="store_true", help="skip the fresh-interpreter measurement")
    args = parser.parse_args()
    torch.set_num_threads(1)  # as the estimate sandbox runs it (server/estimate/runner.py)
    header = (f"{'model':28s} {'batch':>5s} {'params':>7s} {'GPUs':>4s} {'estimate_s':>10s} {'cpu_s':>6s} {'<=10s':>5s} "
              f"{'max batch: H100-80GB':>20s} {'H200':>10s}")
    lines = [f"# torch {torch.__version__}, {platform.processor() or platform.machine()}, 1 thread, AdamW amp_bf16, "
             "largest-batch search on, warm process", header, "-" * len(header)]
    print("\n".join(lines), flush=True)
    figures: dict[str, object] = {}
    for row in large_rows():
        for batch in row.batches:
            _warm_up(row)
            request = _request(row, batch, args.gpus)
            t0, c0 = time.monotonic(), time.process_time()
            result = estimate(request, search_budget_s=SEARCH_BUDGET_S)
            elapsed, cpu = time.monotonic() - t0, time.process_time() - c0
            by_gpu = {g.gpu: g for g in result.gpus}
            h100 = by_gpu.get("H100-80GB", result.gpus[0])
            h200 = by_gpu.get("H200", result.gpus[-1])
            line = (f"{row.name:28s} {batch:5d} {result.parameter_count / 1e9:6.2f}B {len(result.gpus):4d} "
                    f"{elapsed:10.2f} {cpu:6.2f} {'yes' if cpu <= TARGET_S else 'NO':>5s} "
                    f"{_max_batch(h100):>20s} {_max_batch(h200):>10s}")
            print(line, flush=True)
            lines.append(line)
            figures[f"{row.name} batch {batch}"] = {
                "parameters_count": result.parameter_count, "gpus_count": len(result.gpus), "estimate_s": elapsed,
                "cpu_s": cpu, "within_target_ok": cpu <= TARGET_S, "max_batch_h100_count": h100.max_batch_size,
                "max_batch_h200_count": h200.max_batch_size,
                "max_batch_exact_ok": all(g.max_batch_size_exact for g in result.gpus)}
    cold = None
    if not args.no_cold:
        first = large_rows()[0]
        cold = _cold(first, first.batches[0], args.gpus)
        line = (f"# cold first estimate ({first.name}, fresh interpreter, imports of torch and transformers "
                f"included): {cold:.2f} s CPU")
        print(line)
        lines.append(line)
    if args.out:
        args.out.write_text("\n".join(lines) + "\n")
    write_report(__file__, {"torch_version": torch.__version__, "target_s": TARGET_S,
                            "cold_first_estimate_cpu_s": cold, "rows": figures})


if __name__ == "__main__":
    main()
