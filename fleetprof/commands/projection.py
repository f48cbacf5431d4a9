"""`fleetprof projection JOB_ID --gpu TYPE`: the job's measured run projected onto another GPU type (step time,
power, energy per step, cost and memory, each with its band)."""

from __future__ import annotations

import argparse
import sys

from fleetprof.api_models import Band, ProjectionOut
from fleetprof.commands.common import add_server_arguments, api_client, checked_job_id
from fleetprof.output import json_text

GIB = 2**30


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("job_id", help="the measured job")
    parser.add_argument("--gpu", required=True, help="target GPU type: a catalogue name (L40S, A100-80GB, ...)")
    parser.add_argument("--format", choices=["table", "json"], default="table")
    add_server_arguments(parser)


def _band(b: Band | None, unit: str, scale: float = 1.0, spec: str = ".3g") -> str:
    if b is None:
        return "unknown"
    return (f"{format(b.central * scale, spec)} {unit} "
            f"[{format(b.low * scale, spec)} - {format(b.high * scale, spec)}]")


def _value(x: float | None, unit: str, scale: float = 1.0) -> str:
    return "unknown" if x is None else f"{x * scale:.3g} {unit}"


def format_table(p: ProjectionOut) -> str:
    m = p.memory
    basis = f"{p.basis} basis" + (", calibrated by this model's runs on both types" if p.calibration else "")
    lines = [
        f"job {p.job_id}: {p.source_gpu} -> {p.target_gpu} ({basis})",
        f"step time      measured {_value(p.measured_step_time_s, 'ms', 1e3):>12}   projected "
        f"{_band(p.step_time_s, 'ms', 1e3)}  ({p.step_time_ratio.central:.2f}x)",
        f"power          measured {_value(p.measured_power_w, 'W'):>12}   projected {_band(p.power_w, 'W')}"
        f"  ({p.power_source})",
        f"energy/step    measured {_value(p.measured_energy_per_step_j, 'J'):>12}   projected "
        f"{_band(p.energy_per_step_j, 'J')}",
        f"cost/step      measured {_value(p.measured_cost_per_step_usd, 'USD'):>12}   projected "
        f"{_band(p.cost_per_step_usd, 'USD')}",
        f"memory         required {_value(m.required_bytes, 'GiB', 1 / GIB)} of {m.target_capacity_bytes / GIB:.1f} "
        f"GiB: fits {'unknown' if m.fits is None else m.fits}",
        "categories (share of the measured step, target/source time ratio):",
    ]
    lines += [f"  {c.category:14} {100 * c.measured_fraction:5.1f} %  x{c.ratio:.2f} "
              f"[{c.ratio_low:.2f}-{c.ratio_high:.2f}]  {c.rule}" for c in p.categories]
    lines += [f"memory: {c}" for c in m.changes]
    if p.split_source is not None:
        lines.append(f"split: {p.split_source}")
    if p.calibration is not None:
        c = p.calibration
        lines.append(f"calibration: {p.source_gpu} runs {', '.join(c.source_job_ids)}; {p.target_gpu} runs "
                     f"{', '.join(c.target_job_ids)}")
    lines += [f"band: {p.band_rule}"] + [f"note: {n}" for n in p.notes]
    return "\n".join(lines) + "\n"


def run(args: argparse.Namespace) -> int:
    job_id = checked_job_id(args.job_id)
    with api_client(args.server, args.token) as api:
        answer = api.projection(job_id, args.gpu)
    sys.stdout.write(json_text(answer.model_dump(mode="json")) if args.format == "json" else format_table(answer))
    return 0
