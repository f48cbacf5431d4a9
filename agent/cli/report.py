"""`fleetprof report JOB_ID [--format table|json|html]`: a job's characterization."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from fleetprof.errors import CliError

from agent.cli.common import add_server_arguments, client_transport
from agent.transport import TransportError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("job_id")
    parser.add_argument("--format", choices=["table", "json", "html"], default="table")
    parser.add_argument("--refresh", action="store_true", help="recompute now instead of a cached report")
    parser.add_argument("--output", "-o", help="write to this file instead of stdout")
    add_server_arguments(parser)


def _human(key: str, value: Any) -> str:
    if value is None:
        return "unknown"
    if key.endswith("_bytes") and isinstance(value, (int, float)):
        return f"{value / 2**30:,.2f} GiB"
    if key.endswith("_j") and isinstance(value, (int, float)):
        return f"{value:,.1f} J ({value / 3.6e6:.4f} kWh)"
    if key.endswith("_s") and isinstance(value, (int, float)):
        return f"{value:,.3f} s"
    if key.endswith("_pct") and isinstance(value, (int, float)):
        return f"{value:.1f} %"
    if key.endswith("_w") and isinstance(value, (int, float)):
        return f"{value:,.1f} W"
    if key.endswith("_fraction") and isinstance(value, (int, float)):
        return f"{value:.3f}"
    if isinstance(value, float):
        return f"{value:,.4g}"
    if isinstance(value, (dict, list)):
        return json.dumps(value)
    return str(value)


def format_table(report: dict[str, Any]) -> str:
    sources = report.get("sources") or {}
    lines = [f"job {report.get('job_id')}  state={report.get('state')}  "
             f"duration={_human('duration_s', report.get('duration_s'))}"]
    for section in ("memory", "time", "utilization", "energy"):
        data = report.get(section)
        if not isinstance(data, dict):
            continue
        lines.append(f"\n[{section}]")
        for key, value in data.items():
            src = sources.get(f"{section}.{key}")
            lines.append(f"  {key:<28} {_human(key, value)}" + (f"   ({src})" if src else ""))
    gpus = report.get("gpus") or []
    if gpus:
        lines.append("\n[gpus]")
        for g in gpus:
            lines.append(f"  {g.get('uuid')}  {g.get('name')}  peak {_human('x_bytes', g.get('peak_used_bytes'))}"
                         f" of {_human('x_bytes', g.get('memory_total_bytes'))}  energy {_human('x_j', g.get('energy_j'))}")
    recs = report.get("recommendations") or []
    if recs:
        lines.append("\n[recommendations]")
        for r in recs:
            lines.append(f"  - {r.get('summary')}\n      why: {r.get('reason')}\n      saving: {r.get('saving')}")
    return "\n".join(lines) + "\n"


def run(args: argparse.Namespace) -> int:
    params = {"refresh": "true"} if args.refresh else {}
    with client_transport(args.server, args.token) as t:
        try:
            if args.format == "html":
                text = t.request("GET", f"/api/v1/jobs/{args.job_id}/report", params={**params, "format": "html"}).body
            else:
                report = t.request("GET", f"/api/v1/jobs/{args.job_id}/report", params=params).body
                text = json.dumps(report, indent=2) + "\n" if args.format == "json" else format_table(report)
        except TransportError as exc:
            raise CliError(str(exc)) from None
    if args.output:
        with open(args.output, "w", encoding="utf-8") as f:
            f.write(text)
    else:
        sys.stdout.write(text)
    return 0
