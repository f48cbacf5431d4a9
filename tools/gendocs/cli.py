"""docs/cli.md from the argparse parsers: `fleetprof.cli.build_parser()` builds every subcommand's parser
(each owning module's `add_arguments`), nested actions (`db upgrade`, `token create`) included."""

from __future__ import annotations

import argparse
import functools

from fleetprof.cli import COMMANDS, build_parser
from fleetprof.errors import EXIT_CODE_MEANINGS
from tools.gendocs.markdown import code, generated_banner, table

# Usage lines are wrapped at a fixed width so the output does not depend on the terminal it ran in.
WIDTH = 100


def _fixed_width(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = functools.partial(parser.formatter_class, width=WIDTH)  # type: ignore[call-arg]


def _subcommands(parser: argparse.ArgumentParser) -> list[tuple[str, str, argparse.ArgumentParser]]:
    """(name, help, parser) of each subcommand, in the order they were added."""
    out = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help or "" for a in action._choices_actions}
            out += [(name, helps.get(name, ""), p) for name, p in action.choices.items()]
    return out


def _argument(action: argparse.Action) -> str:
    if action.option_strings:
        names = ", ".join(action.option_strings)
        if action.nargs == 0:
            return code(names)
        metavar = action.metavar or (action.dest.upper() if not action.choices else
                                     "{" + ",".join(map(str, action.choices)) + "}")
        return code(f"{names} {metavar}")
    return code(action.metavar or action.dest)


def _default(action: argparse.Action) -> str:
    if action.required:
        return "required"
    value = action.default
    if value is None or value is argparse.SUPPRESS or value is False or value == []:
        return ""
    return code(value)


def _section(path: str, help_text: str, parser: argparse.ArgumentParser) -> list[str]:
    _fixed_width(parser)
    usage = parser.format_usage().strip()
    lines = [f"## {path}", "", help_text or (parser.description or ""), "", "```", usage, "```"]
    rows = [(_argument(a), _default(a), a.help or "")
            for a in parser._actions
            if not isinstance(a, argparse._HelpAction | argparse._SubParsersAction) and a.help != argparse.SUPPRESS]
    if rows:
        lines += ["", table(("argument", "default", "meaning"), rows)]
    subs = _subcommands(parser)
    if subs:
        lines += ["", table(("action", "what it does"), [(code(f"{path} {n}"), h) for n, h, _ in subs])]
    out = [lines]
    for name, sub_help, sub in subs:
        out.append(["", *_section(f"{path} {name}", sub_help, sub)])
    return [line for block in out for line in block]


def render() -> str:
    root = build_parser()
    _fixed_width(root)
    parts = [
        generated_banner("the argparse parsers (`fleetprof.cli.build_parser`)"),
        "",
        "# CLI reference",
        "",
        "One entry point, `fleetprof`; every command also has `--help`. Client commands (`run`, `report`, "
        "`rightsizing`, `replay`, `import-trace`, `estimate`) find the server and the token in "
        "`FLEETPROF_SERVER_URL` and `FLEETPROF_TOKEN` ([configuration.md](configuration.md)). Errors go to "
        "stderr as one line with the exit status below. `--format json` puts the answer alone on stdout (messages "
        "and progress bars go to stderr; a progress bar only when stderr is a terminal). `fleetprof --version` "
        "prints the installed version; `source <(fleetprof completion bash)` (or `zsh`) turns on Tab completion.",
        "",
        table(("command", "what it does"),
              [(f"[`fleetprof {n}`](#fleetprof-{n})", h) for n, (_, h) in COMMANDS.items()]),
        "",
        "## Exit status",
        "",
        "The same for every command (`fleetprof.errors.ExitCode`); `fleetprof run` exits with its command's status "
        "instead, and `fleetprof slurm` always with 0.",
        "",
        table(("status", "meaning"), [(code(str(int(c))), m) for c, m in EXIT_CODE_MEANINGS.items()]),
    ]
    for name, help_text, parser in _subcommands(root):
        parts += ["", *_section(f"fleetprof {name}", help_text, parser)]
    return "\n".join(parts) + "\n"
