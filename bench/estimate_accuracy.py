"""Estimator accuracy on this CPU: predicted peak vs a real training step measured by torch.profiler,
next to what parameter-only estimators predict for the same rows.

    .venv/bin/python bench/estimate_accuracy.py [--quick] [--out bench/results/estimate_accuracy_cpu.txt]

Per model x batch size (fp32, AdamW, two steps, the step of server/estimate/step.py):
- ours: the meta-device trace's peak of live tensor bytes (`peak_requested_bytes`: the CPU allocator
  neither caches nor rounds, so this is the comparable figure);
- measured: baseline (parameters, buffers, inputs) + running max of the profiler's [memory] events;
- accelerate: `accelerate estimate-memory`'s training figure, documented as 4 x the model size in the
  training dtype for Adam (weights + gradients + 2 Adam moments); activations ignored;
- deepspeed: `estimate_zero2_model_states_mem_needs(total_params, num_gpus_per_node=1, cpu_offload=False)`,
  GPU side = 4 x params + 16 x params / gpus bytes (fp16 weights+grads, fp32 master weights and moments).
Error = (prediction - measured) / measured. A negative error is an under-estimate: the job would OOM.
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.report import write_report  # noqa: E402
from server.estimate.models import resolve  # noqa: E402
from server.estimate.schemas import InputSpec, ModelSpec  # noqa: E402
from server.estimate.trace_step import StepSettings, trace_step  # noqa: E402
from server.estimate.validation import measure_cpu_peak  # noqa: E402

HF = {
    "gpt2 (6 layers)": ({"model_type": "gpt2", "n_layer": 6}, 128),
    "bert-base (6 layers)": ({"model_type": "bert", "num_hidden_layers": 6}, 128),
    "t5-small": ({"model_type": "t5"}, 64),
    "vit-base (6 layers)": ({"model_type": "vit", "num_hidden_layers": 6}, None),
}
CNN = {"resnet50 @128px": ("server.estimate.zoo:resnet50", 128), "vgg16 @64px": ("server.estimate.zoo:vgg16", 64)}


def rows(quick: bool) -> list[tuple[str, object, list[int]]]:
    batches = [1, 4] if quick else [1, 4, 8]
    out: list[tuple[str, object, list[int]]] = []
    for name, (cfg, seq) in HF.items():
        out.append((name, resolve(ModelSpec(hf_config=cfg), [], seq, "auto"), batches))
    for name, (factory, hw) in CNN.items():
        out.append((name, resolve(ModelSpec(factory=factory), [InputSpec(shape=[3, hw, hw])], None, "auto"), batches))
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    torch.set_num_threads(2)
    settings = StepSettings(optimizer="adamw", precision="fp32")
    header = (f"{'model':22s} {'batch':>5s} {'params':>7s} {'measured':>10s} {'ours':>10s} {'err':>7s} "
              f"{'accelerate':>10s} {'err':>7s} {'deepspeed':>10s} {'err':>7s} {'trace_s':>7s}")
    lines = [f"# torch {torch.__version__}, {platform.processor() or platform.machine()}, fp32 AdamW (foreach), "
             "MiB = 2^20 bytes", header, "-" * len(header)]
    print("\n".join(lines), flush=True)
    figures: dict[str, dict[str, object]] = {}
    for name, resolved, batches in rows(args.quick):
        for batch in batches:
            t0 = time.monotonic()
            st = trace_step(resolved, settings, batch)  # type: ignore[arg-type]
            trace_s = time.monotonic() - t0
            ours = st.trace.peak_requested_bytes()
            measured = measure_cpu_peak(resolved, settings, batch)  # type: ignore[arg-type]
            accelerate = 4 * st.parameter_bytes
            deepspeed = 4 * st.parameter_count + 16 * st.parameter_count

            def err(x: int) -> str:
                return f"{100 * (x - measured) / measured:+6.1f}%"

            line = (f"{name:22s} {batch:5d} {st.parameter_count / 1e6:6.1f}M {measured / 2**20:10.1f} "
                    f"{ours / 2**20:10.1f} {err(ours)} {accelerate / 2**20:10.1f} {err(accelerate)} "
                    f"{deepspeed / 2**20:10.1f} {err(deepspeed)} {trace_s:7.2f}")
            print(line, flush=True)
            lines.append(line)
            figures[f"{name} batch {batch}"] = {
                "parameters_count": st.parameter_count, "measured_bytes": measured, "ours_bytes": ours,
                "ours_error_fraction": (ours - measured) / measured, "accelerate_bytes": accelerate,
                "accelerate_error_fraction": (accelerate - measured) / measured, "deepspeed_bytes": deepspeed,
                "deepspeed_error_fraction": (deepspeed - measured) / measured, "trace_s": trace_s}
    if args.out:
        args.out.write_text("\n".join(lines) + "\n")
    write_report(__file__, {"torch_version": torch.__version__, "rows": figures})


if __name__ == "__main__":
    main()
