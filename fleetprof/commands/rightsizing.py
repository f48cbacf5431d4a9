"""`fleetprof rightsizing JOB_ID | --name NAME [--team TEAM]`: what to request for a job, or for the next run of a
recurring one (GPU type and count, batch size, power cap), with reasons, evidence and savings."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from fleetprof.commands.common import add_server_arguments, api_client, checked_job_id
from fleetprof.commands.tables import recommendation_lines, section_lines
from fleetprof.errors import CliError
from fleetprof.output import json_text


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("job_id", nargs="?", help="a job (its runs of the same name and team are the history)")
    parser.add_argument("--name", help="instead of a job: the recurring job's name (its next run has no id yet)")
    parser.add_argument("--team", help="with --name: the team (default: a team token's own; else the latest run's)")
    parser.add_argument("--history", type=int, default=50, help="past runs to use (default 50)")
    parser.add_argument("--format", choices=["table", "json"], default="table")
    add_server_arguments(parser)


def format_table(answer: dict[str, Any]) -> str:
    runs = answer.get("history_job_ids") or []
    lines = [f"right-sizing from job {answer.get('job_id')} (name {answer.get('name') or '-'}, "
             f"team {answer.get('team') or '-'}): {len(runs)} run(s): {', '.join(runs) or 'none'}"]
    for key, value in answer.items():
        if isinstance(value, dict) and value:
            lines.append(f"\n[{key}]")
            lines += section_lines(value, {}, key)
    lines += recommendation_lines(answer.get("recommendations") or [])
    candidates = answer.get("projections") or []
    if candidates or answer.get("projection_unavailable"):
        lines.append("\n[other GPU types] (projected from the latest run; bands in brackets)")
        lines += [f"  {c['summary']}" for c in candidates]
        if answer.get("projection_unavailable"):
            lines.append(f"  unavailable: {answer['projection_unavailable']}")
    return "\n".join(lines) + "\n"


def run(args: argparse.Namespace) -> int:
    if (args.job_id is None) == (args.name is None):
        raise CliError("give a job id, or --name NAME for a recurring job: one of the two")
    if args.team and not args.name:
        raise CliError("--team goes with --name")
    job_id = None if args.job_id is None else checked_job_id(args.job_id)
    with api_client(args.server, args.token) as api:
        answer = api.rightsizing(job_id, name=args.name, team=args.team, history=args.history)
    sys.stdout.write(json_text(answer) if args.format == "json" else format_table(answer))
    return 0
