"""Helpers for the deployment checks: compose interpolation, shell command splitting, and parsing a command line
with the real `fleetprof` argument parser (so a renamed flag or subcommand breaks these tests, not a deployment)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

from fleetprof.cli import COMMANDS, build_parser

REPO_ROOT = Path(__file__).resolve().parents[2]
DEPLOY = REPO_ROOT / "deploy"
COMPOSE_FILE = REPO_ROOT / "docker-compose.yml"

_INTERP = re.compile(r"\$\$|\$\{(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?:(?P<op>:?[-?])(?P<default>[^}]*))?\}")
_SHELLS = {"sh", "/bin/sh", "bash", "/bin/bash"}
_SEPARATORS = {"&&", "||", "|", ";", "&", "{", "}", "(", ")"}
_REDIRECTS = {">", ">>", "<", "2>", "&>"}
_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")


def interpolate(value: object, env: dict[str, str] | None = None) -> object:
    """Compose-style `${VAR}`, `${VAR:-default}` and `$$` over a loaded YAML tree (what `docker compose config`
    does), with `env` standing in for the caller's environment."""
    env = env or {}
    if isinstance(value, str):
        def sub(m: re.Match[str]) -> str:
            if m.group(0) == "$$":
                return "$"
            name, default = m.group("name"), m.group("default") or ""
            return env.get(name) or default
        return _INTERP.sub(sub, value)
    if isinstance(value, dict):
        return {k: interpolate(v, env) for k, v in value.items()}
    if isinstance(value, list):
        return [interpolate(v, env) for v in value]
    return value


def argv_of(value: str | list[str] | None) -> list[str]:
    if value is None:
        return []
    return shlex.split(value) if isinstance(value, str) else [str(v) for v in value]


def shell_commands(script: str) -> list[list[str]]:
    """The simple commands of a shell script (split at &&, ||, |, ;, braces), redirections and leading
    `VAR=value` assignments and `exec` removed."""
    lexer = shlex.shlex(script, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    commands: list[list[str]] = []
    current: list[str] = []
    tokens = list(lexer)
    i = 0
    while i < len(tokens):
        tok = tokens[i]
        if tok in _SEPARATORS:
            if current:
                commands.append(current)
            current = []
        elif tok in _REDIRECTS:
            i += 1  # skip the target
        else:
            current.append(tok)
        i += 1
    if current:
        commands.append(current)
    cleaned = []
    for cmd in commands:
        while cmd and (_ASSIGNMENT.match(cmd[0]) or cmd[0] == "exec"):
            cmd = cmd[1:]
        if cmd:
            cleaned.append(cmd)
    return cleaned


def fleetprof_invocations(argv: list[str]) -> list[list[str]]:
    """Every `fleetprof ...` command an entrypoint/command line runs, looking inside `sh -c SCRIPT`."""
    if not argv:
        return []
    if argv[0] in _SHELLS and len(argv) >= 3 and argv[1] == "-c":
        found = []
        for cmd in shell_commands(argv[2]):
            found += fleetprof_invocations(cmd)
        return found
    if argv[0] == "fleetprof" or argv[0].endswith("/fleetprof"):
        return [argv]
    return []


def parse_fleetprof(argv: list[str]):  # type: ignore[no-untyped-def]
    """Parse `fleetprof SUB ...` with the real CLI parser. Raises AssertionError naming the problem."""
    assert argv and (argv[0] == "fleetprof" or argv[0].endswith("/fleetprof")), argv
    args = argv[1:]
    sub = next((a for a in args if not a.startswith("-")), None)
    assert sub in COMMANDS, f"`{' '.join(argv)}`: {sub!r} is not a fleetprof subcommand ({', '.join(COMMANDS)})"
    parser = build_parser(only=sub)
    try:
        return parser.parse_args(args)
    except SystemExit as exc:  # argparse reports on stderr and exits 2
        raise AssertionError(f"`{' '.join(argv)}` is rejected by the fleetprof CLI (exit {exc.code})") from None


def dockerfile_instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, line continuations joined, comments dropped."""
    out: list[tuple[str, str]] = []
    buf = ""
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not buf and (not line or line.startswith("#")):
            continue
        if buf and line.startswith("#"):
            continue
        if line.endswith("\\"):
            buf += line[:-1] + " "
            continue
        buf += line
        word, _, rest = buf.partition(" ")
        out.append((word.upper(), rest.strip()))
        buf = ""
    return out


def dockerfile_stages(path: Path) -> dict[str, list[tuple[str, str]]]:
    """Instructions per build stage (named by `AS name`, else by index)."""
    stages: dict[str, list[tuple[str, str]]] = {}
    current: list[tuple[str, str]] | None = None
    for instr, rest in dockerfile_instructions(path):
        if instr == "FROM":
            m = re.search(r"\s+AS\s+(\S+)\s*$", rest, re.IGNORECASE)
            name = m.group(1) if m else str(len(stages))
            current = stages.setdefault(name, [])
        if current is not None:
            current.append((instr, rest))
    return stages


def unit_file(path: Path) -> dict[str, list[tuple[str, str]]]:
    """A systemd unit as {section: [(key, value), ...]} (keys may repeat, as systemd allows)."""
    sections: dict[str, list[tuple[str, str]]] = {}
    current = None
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("[") and line.endswith("]"):
            current = sections.setdefault(line[1:-1], [])
            continue
        assert current is not None, f"{path.name}: {line!r} before any [Section]"
        key, sep, value = line.partition("=")
        assert sep, f"{path.name}: not a key=value line: {line!r}"
        current.append((key.strip(), value.strip()))
    return sections
