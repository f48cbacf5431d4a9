"""What the node commands that wrap a process share: the command after `--`, and the agent's log on stderr."""

from __future__ import annotations

import logging
import sys
from collections.abc import Sequence

from fleetprof.errors import CliError


def command_after_dashes(cmd: Sequence[str], usage: str) -> list[str]:
    """The command to run (argparse REMAINDER, with its leading `--` dropped); a one-line error naming `usage`
    when there is none."""
    command = list(cmd)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        raise CliError(f"nothing to run: {usage}")
    return command


def agent_log_to_stderr(prefix: str) -> None:
    """The `agent` loggers (this command's messages and the device layer's) at INFO on stderr, as
    `<prefix>: LEVEL: message`, and nowhere else."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(f"{prefix}: %(levelname)s: %(message)s"))
    log = logging.getLogger("agent")
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    log.propagate = False
