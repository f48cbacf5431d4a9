"""The estimator against a real GPU: `make validate-gpu` (commit its results whenever a GPU is at hand).

    .venv/bin/python bench/validate_gpu.py [--quick] [--no-calibration]

On a CUDA machine:
1. calibration: NVML used memory before this process touched CUDA, then after CUDA init, one cuBLAS GEMM and one
   cuDNN convolution: the difference less `torch.cuda.memory_reserved()` is the CUDA context (outside the
   allocator); `torch.cuda.memory_allocated()` once the GEMM's tensors are gone is the cuBLAS workspace. Both
   are written to server/estimate/calibration.json for the catalogue's entry of this GPU, `measured: true`, with
   the device name and driver (unless --no-calibration);
2. per row of bench/zoo_rows.py:zoo_rows() and batch size (fp32, AdamW, the canned step of server/estimate/step.py,
   on CUDA with real autocast and real kernels): torch.cuda.max_memory_allocated / max_memory_reserved, NVML used
   memory of the device less what it used before this process (what nvidia-smi would show for the job), step
   time (mean of timed steps after two warm ones, synchronised) and energy per step (NVML's cumulative energy
   counter over the timed steps); and the estimator's figures for the same request on this GPU type;
3. writes bench/results/gpu_<device>.md: each measured figure, the estimate and the error (estimate - measured) /
   measured beside it; and JSON via bench/report.py.

Without a GPU it prints one line and exits with status 2: nothing was measured.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import platform
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from bench.report import write_report  # noqa: E402
from bench.zoo_rows import ROW_SETS, ZooRow  # noqa: E402
from server.estimate.calibration import _table  # noqa: E402

RESULTS = ROOT / "bench" / "results"
CALIBRATION = ROOT / "server" / "estimate" / "calibration.json"
TIMED_STEPS = 5
TIMED_MIN_S = 2.0
MiB = 2**20


class _RealCuda:
    """The step's emulation hook on a real GPU: CUDA's own autocast, PyTorch's own attention kernel choice."""

    def __init__(self, dtype: torch.dtype | None) -> None:
        self.autocast_dtype = dtype

    def __enter__(self) -> _RealCuda:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    @contextlib.contextmanager
    def autocast(self) -> Iterator[None]:
        if self.autocast_dtype is None:
            yield
            return
        with torch.autocast("cuda", dtype=self.autocast_dtype):
            yield


def update_calibration(path: Path, gpu: str, *, context_bytes: int, cublas_workspace_bytes: int, device: str,
                       driver: str | None, torch_version: str, date: str) -> dict[str, Any]:
    """Replace the calibration entry of catalogue GPU `gpu` with a measurement; returns the new entry."""
    doc = json.loads(path.read_text())
    entry = {"context_bytes": int(context_bytes), "cublas_workspace_bytes": int(cublas_workspace_bytes),
             "source": f"measured by bench/validate_gpu.py on {device}, driver {driver or 'unknown'}, torch "
                       f"{torch_version}, {date}",
             "measured": True, "device": device, "driver": driver}
    doc["models"][gpu] = entry
    path.write_text(json.dumps(doc, indent=2) + "\n")
    _table.cache_clear()  # estimates from here on read the measured entry
    return entry


def error_fraction(estimate: float | None, measured: float | None) -> float | None:
    if estimate is None or measured is None or measured == 0:
        return None
    return (estimate - measured) / measured


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:+.1f}%"


def _mib(x: float | None) -> str:
    return "n/a" if x is None else f"{x / MiB:.1f}"


def _ms(seconds: float | None) -> str:
    return "n/a" if seconds is None else f"{1e3 * seconds:.1f}"


def _j(joules: float | None) -> str:
    return "n/a" if joules is None else f"{joules:.2f}"


def render_markdown(header: dict[str, Any], calibration: dict[str, Any], rows: list[dict[str, Any]]) -> str:
    lines = [f"# Estimator vs {header['device']} ({header['gpu']})", "",
             f"Measured {header['date']} by bench/validate_gpu.py: driver {header['driver']}, torch "
             f"{header['torch']}, CUDA {header['cuda']}. fp32 AdamW, the canned step (server/estimate/step.py). "
             "MiB = 2^20 bytes; error = (estimate - measured) / measured (negative: the estimate is low).", "",
             "## Calibration (measured)", "",
             f"- CUDA context (NVML used - reserved, after CUDA init, one GEMM, one convolution, two steps of a tiny training net): "
             f"{_mib(calibration['context_bytes'])} MiB",
             f"- cuBLAS workspace (allocated once the GEMM's tensors are freed): "
             f"{_mib(calibration['cublas_workspace_bytes'])} MiB",
             f"- allocated after a tiny training step's tensors are freed (the workspaces of both cuBLAS handles: "
             f"this thread's and the autograd engine's): {_mib(calibration.get('allocated_after_training_step_bytes'))}"
             f" MiB", "",
             "## Rows", "",
             "| model | batch | allocated MiB | est. | err | reserved MiB | est. | err | NVML used MiB | est. | err "
             "| step ms | est. (band) | err | energy J/step | est. | err |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        m, e = r["measured"], r["estimate"]
        band = f"{_ms(e['time_low_s'])}-{_ms(e['time_high_s'])}"
        lines.append(
            f"| {r['model']} | {r['batch']} | {_mib(m['allocated_bytes'])} | {_mib(e['allocated_bytes'])} | "
            f"{_pct(r['errors']['allocated_fraction'])} | {_mib(m['reserved_bytes'])} | {_mib(e['reserved_bytes'])} | "
            f"{_pct(r['errors']['reserved_fraction'])} | {_mib(m['nvml_used_bytes'])} | {_mib(e['device_total_bytes'])}"
            f" | {_pct(r['errors']['nvml_used_fraction'])} | {_ms(m['step_s'])} | {_ms(e['time_s'])} "
            f"({band}) | {_pct(r['errors']['step_time_fraction'])} | "
            f"{_j(m['energy_j'])} | {_j(e['energy_j'])} | "
            f"{_pct(r['errors']['energy_fraction'])} |")
    return "\n".join(lines) + "\n"


def _device_slug(name: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in name).strip("_").lower()


def _nvml():  # type: ignore[no-untyped-def]
    from agent.devices.base import DeviceError
    from agent.devices.nvml import NvmlDevices

    try:
        return NvmlDevices(xid_events=False)
    except DeviceError as exc:
        print(f"validate-gpu: NVML is not usable ({exc}); NVML figures will be n/a", file=sys.stderr)
        return None


def _used(nvml: Any, slot: int) -> int | None:
    if nvml is None:
        return None
    return nvml.read(slot).memory_used_bytes


def _energy_mj(nvml: Any, slot: int) -> int | None:
    if nvml is None:
        return None
    return nvml.read(slot).energy_mj


def _tiny_training_steps() -> int:
    """Two AdamW steps of a tiny conv + MLP net (no zoo model): they load the kernel modules every training step
    uses (backward, optimizer, loss), which CUDA's lazy loading adds to the context. Returns the bytes still
    allocated once its tensors are gone: the cuBLAS workspaces (one per handle: this thread and autograd's)."""
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.BatchNorm2d(8), torch.nn.ReLU(), torch.nn.Flatten(),
                              torch.nn.Linear(8 * 14 * 14, 64), torch.nn.LayerNorm(64), torch.nn.GELU(),
                              torch.nn.Dropout(0.1), torch.nn.Linear(64, 10)).cuda()
    opt = torch.optim.AdamW(net.parameters())
    x, y = torch.randn(4, 3, 16, 16, device="cuda"), torch.randint(0, 10, (4,), device="cuda")
    for _ in range(2):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(net(x).softmax(-1).log(), y).backward()
        opt.step()
    torch.cuda.synchronize()
    del net, opt, x, y
    return torch.cuda.memory_allocated()


def measure_calibration(nvml: Any, slot: int, before_used: int | None) -> tuple[int | None, int, int]:
    """(CUDA context bytes, cuBLAS workspace bytes per handle, allocated after a training step's backward)."""
    a = torch.randn(1024, 1024, device="cuda")
    b = a @ a
    conv = torch.nn.Conv2d(8, 8, 3).cuda()
    c = conv(torch.randn(1, 8, 32, 32, device="cuda"))
    torch.cuda.synchronize()
    del a, b, c, conv
    torch.cuda.synchronize()
    workspace = torch.cuda.memory_allocated()
    after_training = _tiny_training_steps()
    torch.cuda.empty_cache()
    used = _used(nvml, slot)
    context = None if used is None or before_used is None else used - before_used - torch.cuda.memory_reserved()
    return context, workspace, after_training


def measure_row(row: ZooRow, batch: int, nvml: Any, slot: int, before_used: int | None) -> dict[str, Any]:
    from server.estimate.models import resolve
    from server.estimate.schemas import EstimateRequest
    from server.estimate.step import train_steps
    from server.estimate.trace_step import StepSettings, prepare

    request = EstimateRequest.model_validate({**row.body, "batch_size": batch})
    resolved = resolve(request.model, request.inputs, request.seq_len, request.target,
                       registered=(request.model.factory,) if request.model.factory else ())
    settings = StepSettings(optimizer="adamw", precision="fp32")
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    model, data, optimizer, _ = prepare(resolved, settings, batch, torch.device("cuda"))
    real = _RealCuda(None)
    train_steps(model, data, optimizer, real, steps=2)  # type: ignore[arg-type]  # what the estimate traces
    torch.cuda.synchronize()
    allocated, reserved = torch.cuda.max_memory_allocated(), torch.cuda.max_memory_reserved()
    used = _used(nvml, slot)
    # At least TIMED_STEPS and at least TIMED_MIN_S: a small model's step takes milliseconds, and NVML's energy
    # counter moves in coarse updates, so a few steps alone would measure the counter's update period.
    e0, t0 = _energy_mj(nvml, slot), time.perf_counter()
    steps = 0
    while steps < TIMED_STEPS or time.perf_counter() - t0 < TIMED_MIN_S:
        train_steps(model, data, optimizer, real, steps=1)  # type: ignore[arg-type]
        steps += 1
        if steps % 10 == 0:
            torch.cuda.synchronize()
    torch.cuda.synchronize()
    step_s = (time.perf_counter() - t0) / steps
    e1 = _energy_mj(nvml, slot)
    del model, data, optimizer
    return {"allocated_bytes": allocated, "reserved_bytes": reserved,
            "nvml_used_bytes": None if used is None or before_used is None else used - before_used,
            "step_s": step_s, "timed_steps_count": steps,
            "energy_j": None if e0 is None or e1 is None else (e1 - e0) / 1e3 / steps}


def estimate_row(row: ZooRow, batch: int, gpu: str) -> dict[str, Any]:
    from server.estimate.schemas import EstimateRequest
    from server.estimate.service import estimate

    request = EstimateRequest.model_validate({**row.body, "batch_size": batch, "gpu_types": [gpu],
                                              "optimizer": "adamw", "precision": "fp32", "search_max_batch": False})
    factory = request.model.factory
    fit = estimate(request, registered=(factory,) if factory else ()).gpus[0]
    r = fit.roofline
    return {"allocated_bytes": fit.peak_allocated_bytes, "reserved_bytes": fit.peak_reserved_bytes,
            "device_total_bytes": fit.device_total_bytes, "time_s": r.time_per_step_s,
            "time_low_s": r.time_per_step_low_s, "time_high_s": r.time_per_step_high_s, "energy_j": r.energy_per_step_j}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="the first batch size of each row only")
    parser.add_argument("--rows", choices=sorted(ROW_SETS), default="zoo",
                        help="zoo (the accuracy rows) or heldout (models no estimator constant was taken from)")
    parser.add_argument("--no-calibration", action="store_true", help="do not write server/estimate/calibration.json")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print(f"validate-gpu: no CUDA GPU here (torch {torch.__version__}, torch.cuda.is_available() is False): "
              "nothing measured", file=sys.stderr)
        return 2
    from server.analysis.base.gpu_catalog import find_model

    nvml = _nvml()
    slot = 0
    before_used = _used(nvml, slot)  # read before this process creates its CUDA context
    torch.cuda.init()
    device = torch.cuda.get_device_name(0)
    model = find_model(device) or find_model(device.replace("NVIDIA ", ""))
    if model is None:
        print(f"validate-gpu: {device!r} is not in server/analysis/base/gpu_catalog.json (add it, with its aliases)",
              file=sys.stderr)
        return 2
    driver = nvml.node_facts().driver_version if nvml is not None else None
    date = datetime.now(UTC).isoformat(timespec="seconds")
    context, workspace, after_training = measure_calibration(nvml, slot, before_used)
    calibration = {"context_bytes": context, "cublas_workspace_bytes": workspace,
                   "allocated_after_training_step_bytes": after_training}
    if not args.no_calibration and context is not None:
        update_calibration(CALIBRATION, model.name, context_bytes=context, cublas_workspace_bytes=workspace,
                           device=device, driver=driver, torch_version=torch.__version__, date=date)
    rows = []
    for row in ROW_SETS[args.rows]():
        for batch in row.batches[:1] if args.quick else row.batches:
            measured = measure_row(row, batch, nvml, slot, before_used)
            est = estimate_row(row, batch, model.name)
            errors = {
                "allocated_fraction": error_fraction(est["allocated_bytes"], measured["allocated_bytes"]),
                "reserved_fraction": error_fraction(est["reserved_bytes"], measured["reserved_bytes"]),
                "nvml_used_fraction": error_fraction(est["device_total_bytes"], measured["nvml_used_bytes"]),
                "step_time_fraction": error_fraction(est["time_s"], measured["step_s"]),
                "energy_fraction": error_fraction(est["energy_j"], measured["energy_j"]),
            }
            rows.append({"model": row.name, "batch": batch, "measured": measured, "estimate": est, "errors": errors})
            print(f"{row.name:24s} batch {batch:3d}: allocated {_pct(errors['allocated_fraction'])}, reserved "
                  f"{_pct(errors['reserved_fraction'])}, NVML {_pct(errors['nvml_used_fraction'])}, time "
                  f"{_pct(errors['step_time_fraction'])}, energy {_pct(errors['energy_fraction'])}", flush=True)
    header = {"device": device, "gpu": model.name, "driver": driver, "torch": torch.__version__,
              "cuda": torch.version.cuda, "date": date, "host": platform.machine()}
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / f"gpu_{_device_slug(device)}{'' if args.rows == 'zoo' else '_' + args.rows}.md"
    out.write_text(render_markdown(header, calibration, rows))
    print(f"wrote {out.relative_to(ROOT)}")
    write_report(__file__, {"device": device, "gpu": model.name, "driver": driver,
                            "context_bytes": context, "cublas_workspace_bytes": workspace,
                            "allocated_after_training_step_bytes": after_training,
                            "rows": {f"{r['model']} batch {r['batch']}": {
                                **{f"measured_{k}": v for k, v in r["measured"].items()},
                                **{f"estimate_{k}": v for k, v in r["estimate"].items()},
                                **{f"error_{k}": v for k, v in r["errors"].items()}} for r in rows}})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
