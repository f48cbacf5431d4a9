"""`fleetprof download JOB_ID [WHAT] [-o PATH]`: a job's artefacts as files other tools open.

WHAT is `list` (the default: the job's traces and snapshots), `report` (the report as JSON and HTML), `kineto` (every
Kineto trace as uploaded: Perfetto, TensorBoard), `snapshot` (every memory snapshot as the pickle
`torch.cuda.memory._dump_snapshot` writes: pytorch.org/memory_viz), or a trace id from the list. Files go to the
folder `-o` names (default: the working directory) under the names the server gives them; `-o NAME.EXT` with one
file names it.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from fleetprof import units
from fleetprof.client import Client, Download
from fleetprof.commands.common import add_server_arguments, api_client, checked_job_id
from fleetprof.commands.tables import aligned
from fleetprof.errors import CliError
from fleetprof.jobid import job_path

KINDS = {"kineto": "kineto", "snapshot": "snapshot"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("job_id")
    parser.add_argument("what", nargs="?", default="list",
                        help="list (default), report, kineto, snapshot, or a trace id from the list")
    parser.add_argument("--format", choices=["original", "json", "pickle"],
                        help="a trace's format (default: a Kineto trace as uploaded, a snapshot as torch's pickle)")
    parser.add_argument("--output", "-o", help="folder to write into (default: the working directory), or the "
                                               "file name when one file is downloaded")
    add_server_arguments(parser)


def _write(download: Download, output: str | None, fallback: str, single: bool) -> Path:
    name = download.filename or fallback
    target = Path(output) if output else Path.cwd()
    # a folder, unless one file is downloaded to a name with a suffix (`-o snap.pickle`) that is not a folder
    path = target if single and output and target.suffix and not target.is_dir() else target / name
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(download.content)
    except OSError as exc:
        raise CliError(f"cannot write {path}: {exc.strerror}") from None
    return path


def _report(api: Client, job_id: str, output: str | None) -> list[Path]:
    paths = []
    for fmt in ("json", "html"):
        got = api.download(job_path(job_id, "report"), format=fmt, download="true")
        paths.append(_write(got, output, f"fleetprof-report.{fmt}", single=False))
    return paths


def run(args: argparse.Namespace) -> int:
    job_id = checked_job_id(args.job_id)
    what = args.what
    with api_client(args.server, args.token) as api:
        if what == "report":
            paths = _report(api, job_id, args.output)
        else:
            traces = api.traces(job_id)
            if what == "list":
                rows = [[str(t["trace_id"]), t["kind"], t.get("filename") or "-",
                         "-" if t.get("rank") is None else str(t["rank"]), units.size(t["size_bytes"]),
                         ", ".join(t["download_formats"])] for t in traces]
                sys.stdout.write("\n".join(aligned(["id", "kind", "file", "rank", "size", "formats"], rows)) + "\n"
                                 if rows else f"job {job_id} has no stored traces or snapshots\n")
                return 0
            if what in KINDS:
                chosen = [t for t in traces if t["kind"] == KINDS[what]]
                if not chosen:
                    raise CliError(f"job {job_id} has no stored {what} trace")
            else:
                try:
                    trace_id = int(what)
                except ValueError:
                    raise CliError(f"download what? {what!r} is not list, report, kineto, snapshot or a trace "
                                   "id") from None
                chosen = [t for t in traces if t["trace_id"] == trace_id]
                if not chosen:
                    raise CliError(f"job {job_id} has no trace {trace_id} (see `fleetprof download {job_id}`)")
            paths = []
            for t in chosen:
                got = api.download_trace(job_id, t["trace_id"], format=args.format)
                if len(chosen) > 1 and got.filename and sum(x.get("filename") == t.get("filename")
                                                            for x in chosen) > 1:
                    # ranks uploaded under one name: each file keeps its trace id, none overwrites another
                    got = Download(got.content, got.media_type, f"{t['trace_id']}-{got.filename}")
                paths.append(_write(got, args.output, f"trace-{t['trace_id']}", single=len(chosen) == 1))
    for p in paths:
        print(p)
    return 0
