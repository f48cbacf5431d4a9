"""What a CLI command prints for programs: `--format json` puts the answer, and only it, on stdout.

Messages for people (progress, "uploaded ...", warnings) go to stderr in every format, so
`fleetprof replay ... --format json | jq` always reads one JSON document.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any


def add_format_argument(parser: argparse.ArgumentParser, *more: str,
                        help: str = "table for people (default); json for programs: stdout holds the JSON alone"
                        ) -> None:
    """`--format table|json[|more...]`, table by default."""
    parser.add_argument("--format", choices=["table", "json", *more], default="table", help=help)


def json_text(value: Any) -> str:
    """The JSON document `--format json` prints (indented, one trailing newline)."""
    return json.dumps(value, indent=2) + "\n"


def write_json(value: Any) -> None:
    sys.stdout.write(json_text(value))
    sys.stdout.flush()
