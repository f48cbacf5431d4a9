"""`fleetprof run [--job-id ID] [--team T] [--name N] [--batch-size N] [--trace-allocator STEPS] [--profile STEPS]
[--no-hooks] [--apply REF [--batch-size-arg FLAG] [--batch-size-env VAR]] [--format table|json] -- CMD ...`.

`--apply REF` starts the run with the recommendations of job REF's report (or, when REF is not a job id or no
such job is visible, of GET /rightsizing?name=REF) applied (agent.apply), prints one line per applied one on
stderr and records them in the job's metadata (`applied`), which the compare view reads back.

Ends with a summary of the job on stderr (agent.run_summary): a table, or with `--format json` one line of JSON
(stderr too: stdout is the job's own). None when the server cannot be reached.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from agent.apply import ApplyPlan, plan_apply
from agent.cli.console import agent_log_to_stderr, command_after_dashes
from agent.config import AgentSettings, load_settings
from agent.run import HookTraces, JobOutcome, JobRunner, default_job_id
from agent.run_summary import fetch_summary, summary_text
from fleetprof.client import ApiError, Client
from fleetprof.commands.common import checked_job_id
from fleetprof.errors import CliError
from fleetprof.jobid import job_id_problem
from fleetprof.output import add_format_argument


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--job-id", metavar="ID", help="job id (default: slurm:$SLURM_JOB_ID inside a Slurm "
                        "allocation, else <user>-<yyyymmdd-HHMMSS>-<4 hex>)")
    parser.add_argument("--team", help="team that owns the job (default: FLEETPROF_TEAM)")
    parser.add_argument("--name", help="a human name for the job (default: the program's name)")
    parser.add_argument("--no-hooks", action="store_true",
                        help="do not turn on the framework hooks (PyTorch, Keras, JAX)")
    parser.add_argument("--batch-size", type=_positive_int, metavar="N",
                        help="the job's batch size, recorded as the job's own (default: what the hooks read: the "
                             "DataLoader's batch_size, or the leading dimension of the model's first input)")
    parser.add_argument("--trace-allocator", type=_positive_int, metavar="STEPS",
                        help="record the CUDA caching allocator's events over steps 1..STEPS and upload them as a "
                             "memory snapshot (CUDA only: a CPU-only run says so in one line and goes on)")
    parser.add_argument("--profile", type=_positive_int, metavar="STEPS",
                        help="record a torch.profiler (Kineto) trace of steps 1..STEPS, upload it to the job and "
                             "analyze it (time breakdown, kernels, optimization plans)")
    parser.add_argument("--apply", metavar="REF",
                        help="apply the recommendations of job REF's report (or of the right-sizing of the recurring "
                             "job named REF): the allocator setting in the environment, the batch size through "
                             "--batch-size-arg/--batch-size-env; recorded in the job's metadata as `applied`")
    parser.add_argument("--batch-size-arg", metavar="FLAG",
                        help="with --apply: the command-line argument the script reads its batch size from (written "
                             "--batch-size-arg=--batch-size); replaced in CMD, or appended")
    parser.add_argument("--batch-size-env", metavar="VAR",
                        help="with --apply: the environment variable the script reads its batch size from")
    add_format_argument(parser, help="the summary printed on stderr when the job ends: table (default) or json "
                                     "(one line; stdout is the job's own)")
    parser.add_argument("cmd", nargs=argparse.REMAINDER, metavar="-- CMD ...", help="the command to run")


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is not a positive integer")
    return value


def run(args: argparse.Namespace) -> int:
    from fleetprof.protocol import SampleBatch  # noqa: F401 - fail early on a broken install, not after the job

    command = command_after_dashes(args.cmd, "fleetprof run [options] -- CMD ...")
    if args.no_hooks and (args.trace_allocator or args.profile):
        raise CliError("--trace-allocator and --profile are recorded by the hooks: drop --no-hooks")
    agent_log_to_stderr("fleetprof run")
    if (args.batch_size_arg or args.batch_size_env) and not args.apply:
        raise CliError("--batch-size-arg and --batch-size-env go with --apply")
    settings = load_settings(team=args.team)
    plan = _apply_plan(settings, args, command) if args.apply else None
    job_id = checked_job_id(args.job_id) if args.job_id is not None else default_job_id(settings)
    if args.job_id is None:
        print(f"fleetprof run: job id {job_id}", file=sys.stderr)
    batch_size = args.batch_size
    if plan is not None:
        command = plan.command
        batch_size = plan.batch_size if plan.batch_size is not None else batch_size
    result = JobRunner(settings).run(command, job_id=job_id, team=settings.team, name=args.name,
                                     hooks=not args.no_hooks, batch_size=batch_size,
                                     traces=HookTraces(alloc_trace_steps=args.trace_allocator or 0,
                                                       profile_steps=args.profile or 0),
                                     extra_env=plan.env if plan is not None else None,
                                     applied=[a.as_metadata() for a in plan.applied] if plan is not None else None)
    if result.state != "finished":
        print(f"fleetprof run: job {job_id} {result.state} (exit status {result.exit_code})", file=sys.stderr)
    _print_summary(settings, job_id, result, args.format)
    return result.exit_code


def _recommendations(transport: Client, ref: str, team: str | None) -> tuple[str, list[dict[str, Any]]]:
    """(the job the recommendations come from, the recommendations): job REF's report, else the right-sizing of
    the recurring job named REF."""
    if job_id_problem(ref) is None:
        try:
            report = transport.report_json(ref)
            return ref, list(report.get("recommendations") or [])
        except ApiError as exc:
            if exc.status != 404:
                raise CliError(f"--apply {ref}: {exc}") from None
    try:
        body = transport.rightsizing(name=ref, team=team)
    except ApiError as exc:
        raise CliError(f"--apply {ref}: no job with that id, and no right-sizing for that name: {exc}") from None
    return str(body.get("job_id") or ref), list(body.get("recommendations") or [])


def _apply_plan(settings: AgentSettings, args: argparse.Namespace, command: list[str]) -> ApplyPlan:
    if not settings.server_url:
        raise CliError("--apply reads the recommendations from the server: set FLEETPROF_SERVER_URL")
    with Client(settings.server_url, settings.token, timeout_s=settings.http_timeout_s) as transport:
        from_job, recs = _recommendations(transport, args.apply, args.team)
    plan = plan_apply(recs, command, from_job=from_job, batch_size_arg=args.batch_size_arg,
                      batch_size_env=args.batch_size_env)
    for applied in plan.applied:
        print(f"fleetprof run: applied {applied.kind} from {from_job}: {applied.setting}", file=sys.stderr)
    for skipped in plan.skipped:
        print(f"fleetprof run: not applied {skipped}", file=sys.stderr)
    if not plan.applied:
        print(f"fleetprof run: nothing to apply from {from_job}", file=sys.stderr)
    return plan


def _print_summary(settings: AgentSettings, job_id: str, result: JobOutcome, fmt: str) -> None:
    """The job's summary on stderr; nothing when no server is configured or it does not answer."""
    if not settings.server_url:
        return
    with Client(settings.server_url, settings.token, timeout_s=settings.http_timeout_s) as transport:
        summary = fetch_summary(transport, job_id, result, dashboard_url=settings.dashboard_url)
    if summary is not None:
        sys.stderr.write(json.dumps(summary.as_json()) + "\n" if fmt == "json" else summary_text(summary))
        sys.stderr.flush()
