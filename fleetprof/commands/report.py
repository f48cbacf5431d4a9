"""`fleetprof report JOB_ID [--format table|json|html]`: a job's characterization."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from fleetprof import units
from fleetprof.commands.common import add_server_arguments, api_client, checked_job_id
from fleetprof.commands.tables import recommendation_lines, record_lines, section_lines
from fleetprof.errors import CliError
from fleetprof.output import json_text


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("job_id")
    parser.add_argument("--format", choices=["table", "json", "html"], default="table")
    parser.add_argument("--refresh", action="store_true", help="recompute now instead of a cached report")
    parser.add_argument("--output", "-o", help="write to this file instead of stdout")
    add_server_arguments(parser)


SECTIONS = ("memory", "time", "utilization", "energy", "optimization")
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
            lines += section_lines(data, sources, section)
    gpus = report.get("gpus") or []
    if gpus:
        lines.append("\n[gpus]")
        lines += record_lines(gpus, "  ", None)
    lines += health_lines(report.get("health"))
    lines += recommendation_lines(report.get("recommendations") or [])
    return "\n".join(lines) + "\n"


def health_lines(health: Any) -> list[str]:
    """The health section: one line per finding (GPU, kind, summary); 'no findings' when checked and clean."""
    if not isinstance(health, dict):
        return []
    findings = health.get("findings") or []
    lines = ["\n[health]"]
    if not findings:
        lines.append(f"  no findings ({health.get('gpus_checked')} GPUs checked)")
    for f in findings:
        lines.append(f"  {f.get('gpu_uuid')}  {f.get('kind')} ({f.get('severity') or 'info'}): {f.get('summary')}")
    return lines


def run(args: argparse.Namespace) -> int:
    job_id = checked_job_id(args.job_id)
    with api_client(args.server, args.token) as api:
        if args.format == "html":
            text = api.report_html(job_id, refresh=args.refresh)
        else:
            report = api.report_json(job_id, refresh=args.refresh)
            text = json_text(report) if args.format == "json" else format_table(report)
    if args.output:
        try:
            with open(args.output, "w", encoding="utf-8") as f:
                f.write(text)
        except OSError as exc:
            raise CliError(f"cannot write {args.output}: {exc.strerror}") from None
    else:
        sys.stdout.write(text)
    return 0
