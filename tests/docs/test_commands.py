"""Every `fleetprof ...` command shown in a shell block of README.md or docs/*.md is accepted by the real argument
parser, so a renamed command or option cannot leave the guides behind. (That they do what they say was checked by
running them against `fleetprof up`; this guards the syntax from then on.)"""

from __future__ import annotations

import contextlib
import io
import re
import shlex
from pathlib import Path

import pytest

from fleetprof.cli import build_parser

REPO_ROOT = Path(__file__).resolve().parents[2]
SHELL_BLOCK = re.compile(r"^```(?:bash|sh|shell)\n(.*?)^```", re.S | re.M)
COMMAND = re.compile(r"^(?:[A-Z_]+=\S+\s+)*(?:[^\s=]*/)?fleetprof\s")


def shell_commands(text: str) -> list[list[str]]:
    """`fleetprof` invocations in shell blocks: continuation lines joined, comments and env prefixes dropped."""
    out = []
    for block in SHELL_BLOCK.findall(text):
        for line in block.replace("\\\n", " ").splitlines():
            line = line.strip()
            if not COMMAND.match(line):
                continue
            lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
            lexer.whitespace_split = True
            words = list(lexer)
            # The command ends where the shell's pipes, redirections and lists begin.
            end = next((i for i, w in enumerate(words) if w and set(w) <= set("|&;<>")), len(words))
            start = next(i for i, w in enumerate(words)
                         if w == "fleetprof" or (w.endswith("/fleetprof") and "=" not in w))
            out.append(words[start + 1:end])
    return out


def documented_commands() -> list[tuple[str, list[str]]]:
    docs = [REPO_ROOT / "README.md", *sorted((REPO_ROOT / "docs").glob("*.md"))]
    return [(f"{d.name}: fleetprof {shlex.join(argv)}", argv) for d in docs for argv in shell_commands(d.read_text())]


COMMANDS = documented_commands()


def test_the_guides_show_commands() -> None:
    assert len(COMMANDS) > 30
    assert {argv[0] for _, argv in COMMANDS} >= {"up", "token", "run", "report", "rightsizing", "replay",
                                                 "import-trace", "estimate"}


@pytest.mark.parametrize(("where", "argv"), COMMANDS, ids=[w for w, _ in COMMANDS])
def test_documented_command_parses(where: str, argv: list[str]) -> None:
    parser = build_parser(only=argv[0])
    stderr = io.StringIO()
    with contextlib.redirect_stderr(stderr):
        try:
            parser.parse_args(argv)
        except SystemExit as exc:
            pytest.fail(f"{where}: {stderr.getvalue().strip() or exc}")


def test_a_wrong_option_is_caught() -> None:
    text = ("```bash\nfleetprof report cnn-1 --fromat json   # typo\n"
            "FOO=1 .venv/bin/fleetprof up --port 1 \\\n  --no-agent\n```\n")
    assert shell_commands(text) == [["report", "cnn-1", "--fromat", "json"], ["up", "--port", "1", "--no-agent"]]
    with contextlib.redirect_stderr(io.StringIO()), pytest.raises(SystemExit):
        build_parser(only="report").parse_args(["report", "cnn-1", "--fromat", "json"])
