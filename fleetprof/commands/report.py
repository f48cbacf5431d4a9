"""`fleetprof report JOB_ID [--format table|json|html] [--to mlflow|wandb]`: a job's characterization; `--to` also
logs its headline figures and the report (JSON, HTML) to MLflow or Weights & Biases (fleetprof/trackers.py; the
trackers' own settings, e.g. MLFLOW_TRACKING_URI, WANDB_MODE, apply)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from fleetprof import units
from fleetprof.commands.common import add_server_arguments, api_client, checked_job_id
from fleetprof.commands.tables import recommendation_lines, record_lines, section_lines
from fleetprof.errors import CliError
from fleetprof.output import json_text
from fleetprof.trackers import TRACKERS, log_report


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("job_id")
    parser.add_argument("--format", choices=["table", "json", "html"], default="table")
    parser.add_argument("--refresh", action="store_true", help="recompute now instead of a cached report")
    parser.add_argument("--output", "-o", help="write to this file instead of stdout")
    parser.add_argument("--to", action="append", choices=TRACKERS, default=[],
                        help="also log the headline figures and the report to this tracker (repeatable)")
    parser.add_argument("--project", help="with --to: the MLflow experiment / W&B project (default: the tracker's)")
    add_server_arguments(parser)


SECTIONS = ("memory", "time", "utilization", "energy", "optimization", "fingerprint")
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
    """The health section: one line per finding (GPU, kind, summary, [source]: it says when the data came from the
    NVML test double or a replay); 'no findings' when checked and clean."""
    if not isinstance(health, dict):
        return []
    findings = health.get("findings") or []
    lines = ["\n[health]"]
    if not findings:
        lines.append(f"  no findings ({health.get('gpus_checked')} GPUs checked)")
    for f in findings:
        source = f"  [{f['source']}]" if f.get("source") else ""
        lines.append(f"  {f.get('gpu_uuid')}  {f.get('kind')} ({f.get('severity') or 'info'}): {f.get('summary')}"
                     f"{source}")
    return lines


def run(args: argparse.Namespace) -> int:
    job_id = checked_job_id(args.job_id)
    with api_client(args.server, args.token) as api:
        html = report = None
        if args.format == "html" or args.to:
            html = api.report_html(job_id, refresh=args.refresh)
        if args.format != "html" or args.to:  # after the HTML: the same (recomputed) report, not a second one
            report = api.report_json(job_id, refresh=args.refresh and html is None)
        if args.format == "html":
            assert html is not None
            text = html
        else:
            assert report is not None
            text = json_text(report) if args.format == "json" else format_table(report)
    for tracker in dict.fromkeys(args.to):
        assert report is not None
        options = {"experiment": args.project} if tracker == "mlflow" else {"project": args.project}
        run_id = log_report(report, html, to=tracker, **{k: v for k, v in options.items() if v})
        print(f"logged job {job_id} to {tracker}: run {run_id}", file=sys.stderr)
    if args.output:
        try:
            with open(args.output, "w", encoding="utf-8") as f:
                f.write(text)
        except OSError as exc:
            raise CliError(f"cannot write {args.output}: {exc.strerror}") from None
    else:
        sys.stdout.write(text)
    return 0
