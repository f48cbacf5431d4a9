"""`fleetprof replay FILE --job-id ID --node NAME`: send recorded telemetry through the agents' ingest API.

FILE is an `nvidia-smi --query-gpu=... --format=csv` log (or a capture holding such sections) or a fleetprof
JSONL recording. The job is registered, bound to the recording's GPUs, and marked finished at the end of the
file unless --keep-running. It is the demo source and a load generator (`--realtime` paces it as recorded).

A collector that sheds load (429/503 + Retry-After) or is briefly down is waited for, up to --retry-for seconds
per request: every request is idempotent (a batch is stored once by (agent, seq); registration is an upsert), so
a retry never duplicates. A refusal that will not change (400, 401, 403, 413, 422) fails at once. On a terminal a
progress bar counts the samples sent (stderr); `--format json` prints what was sent as one JSON object on stdout.
"""

from __future__ import annotations

import argparse
import sys
import time
import uuid

from fleetprof.commands.common import add_server_arguments, api_client, checked_job_id
from fleetprof.errors import CliError
from fleetprof.output import add_format_argument, write_json
from fleetprof.progress import Progress
from fleetprof.recordings import RecordingError, iter_timesteps, make_batch, read_recording


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file", help="nvidia-smi CSV log/capture, or fleetprof .jsonl recording")
    parser.add_argument("--job-id", required=True, help="job to attribute the telemetry to")
    parser.add_argument("--node", required=True, help="node name the GPUs belong to")
    parser.add_argument("--team", help="team of the job (team tokens imply their own)")
    parser.add_argument("--gpu-name", help="override the GPU model name in the recording")
    parser.add_argument("--tz", default="UTC", help="time zone of nvidia-smi timestamps (default UTC)")
    parser.add_argument("--realtime", action="store_true", help="pace batches as recorded")
    parser.add_argument("--keep-running", action="store_true", help="do not mark the job finished at the end")
    parser.add_argument("--batch-steps", type=int, default=10, help="sampling instants per batch (default 10)")
    parser.add_argument("--retry-for", type=float, default=120.0, metavar="SECONDS",
                        help="keep retrying a request the collector refuses for now (429, 5xx, unreachable) for "
                             "this long, honouring Retry-After (default 120; 0: fail at once)")
    add_format_argument(parser)
    add_server_arguments(parser)


def run(args: argparse.Namespace) -> int:
    checked_job_id(args.job_id)
    if args.retry_for < 0:
        raise CliError(f"--retry-for must be >= 0, not {args.retry_for}")
    try:
        rec = read_recording(args.file, tz=args.tz)
    except RecordingError as exc:
        raise CliError(f"{args.file}: {exc}") from None
    if args.gpu_name:
        rec.gpus = [g.model_copy(update={"name": args.gpu_name}) for g in rec.gpus]
    agent_id = f"replay:{args.node}:{args.job_id}:{uuid.uuid4().hex[:8]}"
    steps = list(iter_timesteps(rec))
    total_rows = sum(len(group) for group in steps)
    sent = batches = 0
    prev_hi = rec.start_ts
    with api_client(args.server, args.token) as t, \
            Progress(f"replay {args.job_id}", total_rows, unit="samples") as progress:

        def post(path: str, payload: dict[str, object]) -> None:
            t.request_retrying("POST", path, json_body=payload, give_up_after_s=args.retry_for)

        post("/api/v1/jobs", {
            "job_id": args.job_id, "team": args.team, "node": args.node, "state": "running",
            "started_at": rec.start_ts, "gpu_uuids": [g.uuid for g in rec.gpus],
            "metadata": {"replay": True, "replay_file": str(args.file), "recording_source": rec.source},
        })
        for seq, start in enumerate(range(0, len(steps), args.batch_steps)):
            chunk = steps[start:start + args.batch_steps]
            rows = [r for group in chunk for r in group]
            lo, hi = rows[0].ts, rows[-1].ts
            procs = [p for p in rec.processes if lo <= p.ts <= hi]
            for p in procs:
                p.job_id = p.job_id or args.job_id
            batch = make_batch(rows, rec=rec, node=args.node, agent_id=agent_id, seq=seq, sent_at=time.time(),
                               processes=procs)
            if args.realtime and seq > 0:
                time.sleep(max(0.0, lo - prev_hi))
            post("/api/v1/ingest/samples", batch.model_dump(mode="json", exclude_none=True))
            prev_hi = hi
            sent += len(rows)
            batches += 1
            progress.update(sent)
        if not args.keep_running:
            post("/api/v1/jobs", {"job_id": args.job_id, "state": "finished", "ended_at": rec.end_ts,
                                  "exit_code": 0})
    if args.format == "json":
        write_json({"job_id": args.job_id, "node": args.node, "file": str(args.file), "gpus": len(rec.gpus),
                    "samples": sent, "batches": batches, "started_at": rec.start_ts, "ended_at": rec.end_ts,
                    "state": "running" if args.keep_running else "finished", "recording_source": rec.source})
    print(f"replayed {sent} samples of {len(rec.gpus)} GPU(s) from {args.file} as job {args.job_id} "
          f"on node {args.node}", file=sys.stderr)
    return 0
