"""`fleetprof report JOB_ID [--format table|json|html]`: a job's characterization."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from fleetprof import units
from fleetprof.errors import CliError

from agent.cli.common import add_server_arguments, client_transport
from agent.transport import TransportError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("job_id")
    parser.add_argument("--format", choices=["table", "json", "html"], default="table")
    parser.add_argument("--refresh", action="store_true", help="recompute now instead of a cached report")
    parser.add_argument("--output", "-o", help="write to this file instead of stdout")
    add_server_arguments(parser)


SECTIONS = ("memory", "time", "utilization", "energy", "optimization")
MAX_ROWS = 12  # rows of a record list shown in the table (all are in --format json)


def _is_records(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(v, dict) for v in value)


def _is_flat(value: dict[str, Any]) -> bool:
    return not any(isinstance(v, dict) or _is_records(v) for v in value.values())


def _cell(key: str, value: Any, parent_suffix: str | None, *, in_record: bool = False) -> str:
    numbers = isinstance(value, list) and all(isinstance(v, (int, float)) for v in value)
    if isinstance(value, list) and (len(value) > 8 or (in_record and numbers and value)):
        return f"{len(value):,} points"  # a series: the table says how long, json/html show it
    return units.by_key(key, value, parent_suffix=parent_suffix)


def _records(rows: list[dict[str, Any]], indent: str, parent_suffix: str | None) -> list[str]:
    """A list of records (layers, per-rank figures, swapped tensors) as an aligned sub-table."""
    columns = list(dict.fromkeys(k for row in rows for k in row))
    cells = [[_cell(c, row.get(c), parent_suffix, in_record=True) for c in columns] for row in rows[:MAX_ROWS]]
    header = columns
    widths = [max(len(h), *(len(r[i]) for r in cells)) for i, h in enumerate(header)]
    lines = [indent + "  ".join(h.ljust(w) for h, w in zip(header, widths)).rstrip()]
    lines += [indent + "  ".join(v.ljust(w) for v, w in zip(r, widths)).rstrip() for r in cells]
    if len(rows) > MAX_ROWS:
        lines.append(f"{indent}(+{len(rows) - MAX_ROWS} more rows: --format json)")
    return lines


def _section(data: dict[str, Any], sources: dict[str, str], prefix: str, indent: str = "  ",
             parent_suffix: str | None = None) -> list[str]:
    lines = []
    for key, value in data.items():
        src = units.source(sources.get(f"{prefix}.{key}"))
        suffix = units.unit_suffix(key) or parent_suffix
        if _is_records(value):
            lines.append(f"{indent}{key} ({len(value)} rows)")
            lines += _records(value, indent + "  ", suffix)
        elif isinstance(value, dict) and value and not _is_flat(value):
            lines.append(f"{indent}{key}")
            lines += _section(value, sources, f"{prefix}.{key}", indent + "  ", suffix)
        else:
            lines.append(f"{indent}{key:<30} {_cell(key, value, parent_suffix)}" + (f"   [{src}]" if src else ""))
    return lines


def format_table(report: dict[str, Any]) -> str:
    """The report for a terminal: every figure with its unit and, in brackets, where it came from."""
    sources = report.get("sources") or {}
    lines = [f"job {report.get('job_id')}  state={report.get('state')}  "
             f"duration={units.seconds(report.get('duration_s'))}  "
             f"analyzed={units.timestamp(report.get('analyzed_at'))}"]
    for section in SECTIONS:
        data = report.get(section)
        if isinstance(data, dict) and data:
            lines.append(f"\n[{section}]")
            lines += _section(data, sources, section)
    gpus = report.get("gpus") or []
    if gpus:
        lines.append("\n[gpus]")
        lines += _records(gpus, "  ", None)
    recs = report.get("recommendations") or []
    if recs:
        lines.append("\n[recommendations]")
        for r in recs:
            saving = r.get("saving")
            lines.append(f"  - {r.get('summary')}  ({r.get('kind')})\n      why: {r.get('reason')}")
            if isinstance(saving, dict) and saving:
                lines.append(f"      saving: {units.by_key('saving', saving)}")
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
