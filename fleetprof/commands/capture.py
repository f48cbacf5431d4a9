"""`fleetprof capture JOB_ID [--kind kineto|allocator] [--steps K] [--ranks 0,1] [--wait S]`: ask a running job's
hooks for a live capture of K steps; prints the capture's id and state (with --wait, its state once it is analyzed
or failed, or when S seconds have passed)."""

from __future__ import annotations

import argparse
import sys
import time

from fleetprof.api_models import MAX_CAPTURE_STEPS, Capture
from fleetprof.commands.common import add_server_arguments, api_client, checked_job_id
from fleetprof.errors import CliError, ExitCode

FINAL = ("analyzed", "failed")
POLL_S = 1.0


def parse_ranks(value: str) -> list[int]:
    try:
        ranks = [int(part) for part in value.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--ranks {value!r}: a comma-separated list of ranks, e.g. 0,1") from None
    if not ranks or min(ranks) < 0:
        raise argparse.ArgumentTypeError(f"--ranks {value!r}: ranks are integers >= 0, e.g. 0,1")
    return ranks


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("job_id", help="the running job")
    parser.add_argument("--kind", choices=["kineto", "allocator"], default="kineto",
                        help="kineto: a PyTorch profiler trace; allocator: the CUDA allocator history (default kineto)")
    parser.add_argument("--steps", type=int, default=5, help=f"training steps to capture, 1..{MAX_CAPTURE_STEPS} "
                                                             "(default 5)")
    parser.add_argument("--ranks", type=parse_ranks, help="ranks that capture, e.g. 0,1 (default: every rank)")
    parser.add_argument("--wait", type=float, default=0.0, metavar="S",
                        help="wait up to S seconds for the capture to be analyzed (or to fail)")
    add_server_arguments(parser)


def line(capture: Capture) -> str:
    return f"{capture.capture_id} {capture.state}" + (f" ({capture.reason})" if capture.reason else "")


def run(args: argparse.Namespace) -> int:
    job_id = checked_job_id(args.job_id)
    if not 1 <= args.steps <= MAX_CAPTURE_STEPS:
        raise CliError(f"--steps {args.steps}: between 1 and {MAX_CAPTURE_STEPS}")
    if args.wait < 0:
        raise CliError("--wait: seconds >= 0")
    with api_client(args.server, args.token) as api:
        capture = api.request_capture(job_id, kind=args.kind, steps=args.steps, ranks=args.ranks)
        deadline = time.monotonic() + args.wait
        while capture.state not in FINAL and time.monotonic() < deadline:
            time.sleep(min(POLL_S, max(0.0, deadline - time.monotonic())))
            capture = api.capture_state(job_id, capture.capture_id)
    if capture.state == "failed":
        raise CliError(f"capture {capture.capture_id} failed: {capture.reason}", ExitCode.REJECTED)
    sys.stdout.write(line(capture) + "\n")
    return 0
