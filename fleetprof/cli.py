"""The `fleetprof` console entry point: parses the subcommand and hands it to the package that owns it.

Subcommand modules are imported lazily so that `fleetprof agent` on a GPU node imports neither the server
(FastAPI, SQLAlchemy) nor the dashboard.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import sys
from collections.abc import Sequence

from fleetprof.errors import CliError, ExitCode

# subcommand -> module that provides `add_arguments(parser)` and `run(args) -> int`
COMMANDS: dict[str, tuple[str, str]] = {
    "up": ("embedded.up", "start collector, worker, dashboard and a local agent (embedded default)"),
    "server": ("server.cli.serve", "run the FastAPI collector and REST API"),
    "worker": ("server.cli.worker", "run a Celery worker (and beat with --beat)"),
    "db": ("server.cli.db", "database maintenance: `db upgrade`"),
    "token": ("server.cli.token", "API tokens: `token create --scope ...`"),
    "models": ("server.cli.models", "model factories estimates may import: `models add module:function` (operator)"),
    "dashboard": ("dashboard.cli", "run the Dash dashboard"),
    "agent": ("agent.cli.agent", "run the node agent (NVML sampler, spool, shipper)"),
    "run": ("agent.cli.run", "run a training command as a profiled job"),
    "tune": ("agent.cli.tune", "sweep a setting over runs of a command and recommend one: `tune power -- CMD`"),
    "slurm": ("agent.cli.slurm", "Slurm prolog/epilog: register a job, end it with its exit status, summarize it"),
    "report": ("fleetprof.commands.report", "print a job's characterization report"),
    "rightsizing": ("fleetprof.commands.rightsizing",
                    "what to request for a job or a recurring job's next run, and why"),
    "projection": ("fleetprof.commands.projection",
                   "a job's step time, energy per step and memory projected onto another GPU type"),
    "replay": ("fleetprof.commands.replay", "send a recorded telemetry file through the ingest API"),
    "capture": ("fleetprof.commands.capture", "ask a running job for a live capture (Kineto or allocator trace)"),
    "import-trace": ("fleetprof.commands.import_trace", "upload a Kineto trace or CUDA memory snapshot for a job"),
    "download": ("fleetprof.commands.download",
                 "a job's artefacts as files: Kineto traces (Perfetto), snapshots (memory_viz), the report"),
    "estimate": ("embedded.estimate", "pre-training memory/time/energy estimate"),
    "completion": ("fleetprof.completion", "print a shell completion script: `fleetprof completion bash|zsh`"),
}


def version() -> str:
    """The installed package's version (importlib.metadata), "unknown" when run from a tree never installed."""
    try:
        return importlib.metadata.version("fleetprof")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="fleetprof", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"fleetprof {version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, (module_name, help_text) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        if only is None or only == name:
            importlib.import_module(module_name).add_arguments(p)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    # Only the named command's module is imported ("" for none: `--version`, `--help`, a misspelt command).
    command = next((a for a in argv if not a.startswith("-")), "")
    parser = build_parser(only=command)
    args = parser.parse_args(argv)
    module = importlib.import_module(COMMANDS[args.command][0])
    try:
        return int(module.run(args) or 0)
    except CliError as exc:
        print(f"fleetprof {args.command}: error: {exc}", file=sys.stderr)
        return int(exc.code)
    except KeyboardInterrupt:
        return int(ExitCode.INTERRUPTED)


if __name__ == "__main__":
    sys.exit(main())
