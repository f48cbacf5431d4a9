"""`fleetprof import-trace JOB_ID FILE [FILE ...]`: upload Kineto or TensorFlow profiler traces, or CUDA memory
snapshots.

Kineto traces (`.json`, `.json.gz`, one file per rank) and TensorFlow profiler traces (the trace viewer's
`<host>.trace.json.gz`: the server tells them apart) are sent as they are. A CUDA memory snapshot (the pickle
written by `torch.cuda.memory._dump_snapshot`) is converted to JSON HERE, with an unpickler that loads no
classes, because the server never unpickles uploads. On a terminal a progress bar shows each upload's bytes
(stderr); `--format json` prints the server's answer for every file as one JSON object on stdout.
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
from pathlib import Path

from fleetprof import units
from fleetprof.client import ApiError
from fleetprof.commands.common import add_server_arguments, api_client, api_failure, checked_job_id
from fleetprof.errors import CliError
from fleetprof.output import add_format_argument, write_json
from fleetprof.progress import Progress
from fleetprof.snapshot import SnapshotFormatError, snapshot_to_json

PICKLE_MAGIC = b"\x80"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("job_id")
    parser.add_argument("files", nargs="+", metavar="FILE",
                        help="Kineto or TensorFlow profiler trace(s), or snapshot pickle/JSON")
    parser.add_argument("--rank", type=int, help="rank of a single trace without distributedInfo")
    add_format_argument(parser)
    add_server_arguments(parser)


def _payload(path: Path) -> bytes:
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise CliError(f"cannot read {path}: {exc.strerror}") from None
    head = gzip.decompress(raw)[:1] if raw[:2] == b"\x1f\x8b" else raw[:1]
    if head != PICKLE_MAGIC:
        return raw if raw[:2] == b"\x1f\x8b" else gzip.compress(raw, compresslevel=5)
    try:
        doc = snapshot_to_json(gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw)
    except SnapshotFormatError as exc:
        raise CliError(f"{path}: not a CUDA memory snapshot: {exc}") from None
    return gzip.compress(json.dumps(doc, separators=(",", ":")).encode(), compresslevel=5)


def run(args: argparse.Namespace) -> int:
    job_id = checked_job_id(args.job_id)
    uploads = []
    with api_client(args.server, args.token) as t:
        for name in args.files:
            path = Path(name)
            body = _payload(path)
            with Progress(f"upload {path.name}", len(body), fmt=units.size) as progress:
                try:
                    info = t.upload_trace(job_id, body, filename=path.name, rank=args.rank,
                                          progress=progress.update if progress.enabled else None)
                except ApiError as exc:
                    raise api_failure(exc, str(path)) from None
            uploads.append({"file": str(path), "uploaded_bytes": len(body), **info})
            state = "uploaded" if info.get("created") else "already uploaded"
            print(f"{path}: {state} as {info.get('kind')} (rank {info.get('rank')}) for job {args.job_id}",
                  file=sys.stderr)
    if args.format == "json":
        write_json({"job_id": args.job_id, "uploads": uploads})
    return 0
