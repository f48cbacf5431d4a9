"""`fleetprof tune power [--caps W,W,... | --steps N] [--name NAME] [--source SRC] -- CMD ...`: a short power-cap
sweep on this node (agent/tune.py).

Each cap runs CMD as a `fleetprof run --name NAME` job (samples carry the enforced limit); the GPUs' own limits
come back at the end, also on Ctrl-C or an error. Then the table (cap W, time/step s, energy/step J, job) and the
recommendation `GET /api/v1/rightsizing?name=NAME` gives are printed on stdout. Setting a limit needs root (or
CAP_SYS_ADMIN); `--source fake:N` sweeps the NVML test double instead of real GPUs (tests, demos).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any

from agent.cli.console import agent_log_to_stderr, command_after_dashes
from agent.config import load_settings
from agent.devices.base import DeviceError, DevicePermissionError, Devices, FieldNotSupportedError
from agent.run import JobRunner, default_job_id
from agent.tune import CapRun, common_constraints_w, physical_slots, run_sweep, sweep_caps_w
from fleetprof.client import ApiError, Client
from fleetprof.errors import CliError, ExitCode


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="knob", metavar="KNOB", required=True)
    p = sub.add_parser("power", help="sweep GPU power caps over runs of a command and recommend one",
                       description="sweep GPU power caps over runs of a command and recommend one")
    caps = p.add_mutually_exclusive_group()
    caps.add_argument("--caps", type=_caps, metavar="W,W,...",
                      help="the caps to run at, in watts (at least 2), e.g. 300,250,200")
    caps.add_argument("--steps", type=int, default=3, metavar="N",
                      help="instead of --caps: N caps evenly spaced from the GPUs' highest accepted limit down to "
                           "their lowest (default 3)")
    p.add_argument("--name", help="the job name every run is recorded under (default: the program's name)")
    p.add_argument("--team", help="team that owns the runs (default: FLEETPROF_TEAM)")
    p.add_argument("--source", help="the GPUs: nvml (default: FLEETPROF_SOURCE) or fake:N (the NVML test double)")
    p.add_argument("cmd", nargs=argparse.REMAINDER, metavar="-- CMD ...", help="the command to run at each cap")


def _caps(text: str) -> list[float]:
    try:
        caps = [float(c) for c in text.split(",") if c.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of watts") from None
    if len(set(caps)) < 2 or any(c <= 0 for c in caps):
        raise argparse.ArgumentTypeError("--caps needs at least 2 distinct positive watt values")
    return caps


def _open(source: str) -> Devices:
    from agent.daemon import SourceError, open_devices

    if source.partition(":")[0] not in ("nvml", "fake"):
        raise CliError(f"--source {source}: power limits can be set on nvml or fake:N GPUs only")
    try:
        return open_devices(source)
    except (SourceError, DeviceError) as exc:
        raise CliError(str(exc)) from None


def run(args: argparse.Namespace) -> int:
    command = command_after_dashes(args.cmd, "fleetprof tune power [options] -- CMD ...")
    agent_log_to_stderr("fleetprof tune")
    settings = load_settings(team=args.team, source=args.source)
    name = args.name or os.path.basename(command[0])
    devices = _open(settings.source)
    try:
        slots = physical_slots(devices)
        try:
            lo, hi = common_constraints_w(devices, slots)
            caps = args.caps if args.caps is not None else sweep_caps_w(lo, hi, args.steps)
        except FieldNotSupportedError as exc:
            raise CliError(f"these GPUs do not let the power limit be set: {exc}") from None
        except ValueError as exc:
            raise CliError(str(exc)) from None
        if devices.source == "test":
            print("fleetprof tune: --source fake: the caps are set on the NVML test double, not on a GPU",
                  file=sys.stderr)

        def run_one(cap_w: float) -> CapRun:
            job_id = default_job_id(settings)
            print(f"fleetprof tune: {cap_w:g} W: job {job_id}", file=sys.stderr)
            result = JobRunner(settings).run(command, job_id=job_id, team=settings.team, name=name)
            return CapRun(power_limit_w=cap_w, job_id=job_id, state=result.state, exit_code=result.exit_code)

        try:
            runs = run_sweep(devices, caps, run_one, slots=slots)
        except DevicePermissionError as exc:
            raise CliError(f"setting the power limit needs root (or CAP_SYS_ADMIN): {exc}", ExitCode.AUTH) from None
        except ValueError as exc:
            raise CliError(str(exc)) from None
    finally:
        devices.close()
    answer = _rightsizing(settings.server_url, settings.token, runs, name, settings.team,
                          settle_s=settings.batch_interval_s + 1.0)
    sys.stdout.write(sweep_text(runs, answer))
    failed = next((r for r in runs if r.state != "finished"), None)
    return failed.exit_code if failed is not None else 0


def _rightsizing(server_url: str | None, token: str | None, runs: list[CapRun], name: str, team: str | None,
                 settle_s: float) -> dict[str, Any] | None:
    if not server_url:
        return None
    time.sleep(settle_s)  # the agent's last batch of the last run (it cuts one every batch_interval_s)
    try:
        with Client(server_url, token) as api:
            return fetch_recommendation(api, runs, name, team)
    except ApiError as exc:
        print(f"fleetprof tune: no recommendation from the server: {exc}", file=sys.stderr)
        return None


def fetch_recommendation(api: Client, runs: list[CapRun], name: str, team: str | None) -> dict[str, Any]:
    """GET /api/v1/rightsizing?name=NAME after computing each sweep run's report afresh (right-sizing reads the
    earlier runs from their cached reports only, and a run's samples may have come in after a first report).
    The answer gets `sweep_runs`: {job_id: that report's `rightsizing_inputs`} (step_time_s, energy_per_step_j,
    the power_limit_w its samples recorded)."""
    inputs: dict[str, Any] = {}
    for r in runs:
        try:
            inputs[r.job_id] = api.report_json(r.job_id, refresh=True).get("rightsizing_inputs") or {}
        except ApiError as exc:
            if exc.status != 404:  # 404: the run was not registered (no server while it ran)
                raise
    body: dict[str, Any] = api.rightsizing(name=name, team=team)
    return {**body, "sweep_runs": inputs}


def _num(value: Any, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def sweep_text(runs: list[CapRun], answer: dict[str, Any] | None) -> str:
    """The sweep's table (each run's report: '-' where unknown) and the power-cap recommendation."""
    rec = next((r for r in (answer or {}).get("recommendations", []) if r.get("kind") == "power_cap"), None)
    measured = (answer or {}).get("sweep_runs") or {}
    lines = [f"{'cap W':>7}  {'recorded W':>10}  {'time/step s':>11}  {'energy/step J':>13}  {'state':<8}  job"]
    for r in runs:
        m = measured.get(r.job_id) or {}
        lines.append(f"{r.power_limit_w:>7.0f}  {_num(m.get('power_limit_w'), '.0f'):>10}  "
                     f"{_num(m.get('step_time_s'), '.4f'):>11}  {_num(m.get('energy_per_step_j'), '.1f'):>13}  "
                     f"{r.state:<8}  {r.job_id}")
    lines.append("source: cap W set through NVML; recorded W (the limit the job's samples carried), time and energy "
                 "per step from each job's report (hooks' steps, NVML energy)")
    if rec is None:
        lines.append("recommendation: none yet (no server, or its reports are not ready): "
                     "fleetprof rightsizing --name NAME")
    else:
        lines.append(f"recommendation: {rec.get('summary')} - {rec.get('reason')}")
    return "\n".join(lines) + "\n"
