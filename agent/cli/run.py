"""`fleetprof run [--job-id ID] [--team T] [--name N] [--no-hooks] -- CMD ...`."""

from __future__ import annotations

import argparse
import logging
import sys

from agent.cli.common import checked_job_id
from agent.config import load_settings
from fleetprof.errors import CliError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--job-id", metavar="ID", help="job id (default: slurm:$SLURM_JOB_ID inside a Slurm "
                        "allocation, else <user>-<yyyymmdd-HHMMSS>-<4 hex>)")
    parser.add_argument("--team", help="team that owns the job (default: FLEETPROF_TEAM)")
    parser.add_argument("--name", help="a human name for the job (default: the program's name)")
    parser.add_argument("--no-hooks", action="store_true", help="do not turn on the PyTorch hooks")
    parser.add_argument("cmd", nargs=argparse.REMAINDER, metavar="-- CMD ...", help="the command to run")


def run(args: argparse.Namespace) -> int:
    from agent.protocol import SampleBatch  # noqa: F401 - fail early on a broken install, not after the job
    from agent.run import JobRunner, default_job_id

    command = list(args.cmd)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        raise CliError("nothing to run: fleetprof run [options] -- CMD ...")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("fleetprof run: %(levelname)s: %(message)s"))
    log = logging.getLogger("agent")
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    log.propagate = False
    settings = load_settings(team=args.team)
    job_id = checked_job_id(args.job_id) if args.job_id is not None else default_job_id(settings)
    if args.job_id is None:
        print(f"fleetprof run: job id {job_id}", file=sys.stderr)
    result = JobRunner(settings).run(command, job_id=job_id, team=settings.team, name=args.name,
                                     hooks=not args.no_hooks)
    if result.state != "finished":
        print(f"fleetprof run: job {job_id} {result.state} (exit status {result.exit_code})", file=sys.stderr)
    return result.exit_code
