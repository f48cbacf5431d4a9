"""`fleetprof slurm prolog|epilog`: what deploy/slurm/'s wrappers run on each node of a Slurm job (as root).

`prolog` registers `slurm:<SLURM_JOB_ID>` (running, its node, its GPUs' UUIDs, its account as team); `epilog`
marks it finished / failed / killed with Slurm's exit status and prints a seff-style summary (agent.slurm).
Neither ever fails the Slurm job: a prolog that exits non-zero drains the node and requeues the job held, an
epilog that does drains the node. Every error is logged to stderr and the exit status is 0; each request has
its own time limit and the wrappers one for the whole command.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from collections.abc import Mapping

from agent.cli.console import agent_log_to_stderr
from agent.config import AgentSettings, load_settings, node_name
from agent.slurm import (
    SlurmJob,
    append_to_job_output,
    end_update,
    job_link,
    registration,
    resolve_gpu_uuids,
    summary_lines,
)
from fleetprof.client import ApiError, Client
from fleetprof.commands.common import add_server_arguments

log = logging.getLogger("agent.slurm")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="slurm_command", metavar="prolog|epilog", required=True)
    prolog = sub.add_parser("prolog", help="register the Slurm job of this environment (state running, its GPUs)")
    epilog = sub.add_parser("epilog", help="mark the Slurm job ended with its exit status and print a summary")
    epilog.add_argument("--job-output", metavar="PATH",
                        help="also append the summary to this file (the job's SLURM_JOB_STDOUT); only to an existing "
                             "regular file the job's user owns, never through a symlink")
    for p in (prolog, epilog):
        add_server_arguments(p)
        p.add_argument("--timeout", type=float, default=10.0, metavar="S", help="seconds per request (default 10)")


def _gpu_index_map(settings: AgentSettings) -> dict[int, str]:
    """NVML index -> UUID of this node's whole GPUs, from the agent's device source; {} when it cannot be read."""
    from agent.daemon import SourceError, open_devices
    from agent.devices.base import DeviceError

    try:
        devices = open_devices(settings.source)
    except (SourceError, DeviceError, ImportError, OSError) as exc:
        log.warning("cannot read this node's GPUs (%s): the job's GPUs are left to the agent's attribution", exc)
        return {}
    try:
        return {g.index: g.uuid for g in devices.gpus() if g.mig_parent_uuid is None}
    except DeviceError as exc:
        log.warning("cannot list this node's GPUs (%s): the job's GPUs are left to the agent's attribution", exc)
        return {}
    finally:
        devices.close()


def _transport(settings: AgentSettings, timeout_s: float, token: str | None = None) -> Client:
    if not settings.server_url:
        raise ValueError("no server: set FLEETPROF_SERVER_URL in the Slurm scripts' environment file")
    return Client(settings.server_url, token or settings.token, timeout_s=timeout_s)


def prolog(settings: AgentSettings, env: Mapping[str, str], *, timeout_s: float) -> None:
    job = SlurmJob.from_environ(env, epilog=False)
    uuids = resolve_gpu_uuids(job.gpus, _gpu_index_map(settings)) if job.gpus else None
    if job.gpus and uuids is None:
        log.warning("GPUs %s of job %s not found on this node: left to the agent's attribution",
                    ",".join(job.gpus), job.job_id)
    node = node_name(settings)
    with _transport(settings, timeout_s) as t:
        t.register_job(registration(job, node=node, gpu_uuids=uuids, now=time.time()))
    log.info("registered %s on %s with %d GPU(s)", job.job_id, node, len(uuids or []))


def epilog(settings: AgentSettings, env: Mapping[str, str], *, timeout_s: float, job_output: str | None) -> None:
    job = SlurmJob.from_environ(env, epilog=True)
    with _transport(settings, timeout_s) as t:
        t.register_job(end_update(job, now=time.time()))
    log.info("%s ended: %s", job.job_id, job.exit.state if job.exit else "unknown")
    report, unavailable = None, None
    try:
        with _transport(settings, timeout_s, settings.slurm_report_token) as t:
            report = t.report_json(job.job_id)
    except ApiError as exc:
        # An agent token may write the job but not read its report: FLEETPROF_SLURM_REPORT_TOKEN (scheduler).
        unavailable = f"the report could not be read: {exc}"
        log.warning("%s", unavailable)
    link = job_link(job.job_id, server_url=settings.server_url or "", dashboard_url=settings.dashboard_url)
    text = "\n".join(summary_lines(job, report, link=link, unavailable=unavailable)) + "\n"
    sys.stdout.write(text)
    sys.stdout.flush()
    if job_output:
        try:
            append_to_job_output(job_output, "\n" + text, uid=job.uid)
        except OSError as exc:
            log.warning("summary not appended to the job's output %s: %s", job_output, exc)


def run(args: argparse.Namespace) -> int:
    agent_log_to_stderr(f"fleetprof slurm {args.slurm_command}")
    try:
        settings = load_settings(server_url=args.server, token=args.token)
        if args.slurm_command == "prolog":
            prolog(settings, os.environ, timeout_s=args.timeout)
        else:
            epilog(settings, os.environ, timeout_s=args.timeout, job_output=args.job_output)
    except Exception as exc:  # noqa: BLE001 - never fail the Slurm job: a failing prolog or epilog drains the node
        log.error("%s: %s (the job is not affected)", type(exc).__name__, exc)
    return 0
