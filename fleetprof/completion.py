"""`fleetprof completion bash|zsh`: a shell completion script generated from the argparse parsers.

The script is static: the parser tree (subcommands, their options, which options take a value and the choices of
those that have them) is written into it as `case` tables, so pressing Tab never starts Python (~9 ms a Tab in
bash, where building the parsers takes ~1.9 s). Positional arguments and option values without choices fall back to
the shell's file completion; after `--` (`fleetprof run -- CMD`) the shell completes CMD as it would on its own
(bash: where the bash-completion package is loaded). Regenerate the script after an upgrade:

    source <(fleetprof completion bash)        # ~/.bashrc
    source <(fleetprof completion zsh)         # ~/.zshrc (after compinit)
"""

from __future__ import annotations

import argparse
import shlex
from dataclasses import dataclass

from fleetprof.cli import build_parser

SHELLS = ("bash", "zsh")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("shell", choices=SHELLS, help="the shell to complete in")


@dataclass(frozen=True)
class CommandNode:
    """One (sub)command of the parser tree: `path` is its words after `fleetprof` ("" for the root)."""

    path: str
    subcommands: tuple[str, ...]
    options: tuple[str, ...]
    value_options: tuple[str, ...]  # options that take a value (its word is skipped while walking the line)
    choices: dict[str, tuple[str, ...]]  # option -> its choices


def command_tree(parser: argparse.ArgumentParser, path: str = "") -> list[CommandNode]:
    """Every command node under `parser`, depth first, from argparse's actions."""
    subs: dict[str, argparse.ArgumentParser] = {}
    options: list[str] = []
    value_options: list[str] = []
    choices: dict[str, tuple[str, ...]] = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            subs.update(action.choices)
        elif action.option_strings and action.help != argparse.SUPPRESS:
            options += action.option_strings
            if action.nargs != 0:
                value_options += action.option_strings
                if action.choices:
                    choices.update({o: tuple(map(str, action.choices)) for o in action.option_strings})
    node = CommandNode(path, tuple(subs), tuple(options), tuple(value_options), choices)
    nodes = [node]
    for name, sub in subs.items():
        nodes += command_tree(sub, f"{path} {name}".strip())
    return nodes


def _words(values: tuple[str, ...]) -> str:
    return shlex.quote(" ".join(values))


def _tables(nodes: list[CommandNode]) -> str:
    """The shell functions both scripts share (plain `case`, valid in bash and zsh)."""
    subs = [f"    {shlex.quote(n.path)}) echo {_words(n.subcommands)} ;;" for n in nodes if n.subcommands]
    opts = [f"    {shlex.quote(n.path)}) echo {_words(n.options)} ;;" for n in nodes if n.options]
    takes = [shlex.quote(f"{n.path}|{o}") for n in nodes for o in n.value_options]
    chosen = [f"    {shlex.quote(f'{n.path}|{o}')}) echo {_words(c)} ;;" for n in nodes for o, c in n.choices.items()]
    return "\n".join([
        "_fleetprof_subcommands() {", '  case "$1" in', *subs, "  esac", "}",
        "_fleetprof_options() {", '  case "$1" in', *opts, "  esac", "}",
        "_fleetprof_takes_value() {", '  case "$1|$2" in', f"    {' | '.join(takes) or '__none__'}) return 0 ;;",
        "  esac", "  return 1", "}",
        "_fleetprof_choices() {", '  case "$1|$2" in', *chosen, "  esac", "}",
        # The command path the words in $@ (the line before the cursor, `fleetprof` first) name, or "--" after `--`.
        "_fleetprof_path() {",
        '  local cmdpath="" word skip=0',
        "  shift",
        '  for word in "$@"; do',
        '    if ((skip)); then skip=0; continue; fi',
        '    if [[ "$word" == "--" ]]; then echo "--"; return; fi',
        '    if [[ "$word" == -* ]]; then',
        '      [[ "$word" != *=* ]] && _fleetprof_takes_value "$cmdpath" "$word" && skip=1',
        "      continue",
        "    fi",
        '    case " $(_fleetprof_subcommands "$cmdpath") " in',
        '      *" $word "*) cmdpath="${cmdpath:+$cmdpath }$word" ;;',
        "    esac",
        "  done",
        '  echo "$cmdpath"',
        "}",
    ])


BASH_MAIN = """\
_fleetprof() {
  local cur="${COMP_WORDS[COMP_CWORD]}" prev="" cmdpath values
  COMPREPLY=()
  cmdpath="$(_fleetprof_path "${COMP_WORDS[@]:0:COMP_CWORD}")"
  if [[ "$cmdpath" == "--" ]]; then  # `run -- CMD`: CMD's own completion where bash-completion is loaded
    local i=1
    while [[ "${COMP_WORDS[i]}" != "--" ]]; do ((i++)); done
    declare -F _command_offset >/dev/null && _command_offset $((i + 1))
    return 0
  fi
  ((COMP_CWORD > 1)) && prev="${COMP_WORDS[COMP_CWORD-1]}"
  if [[ "$prev" == -* && "$prev" != *=* ]] && _fleetprof_takes_value "$cmdpath" "$prev"; then
    values="$(_fleetprof_choices "$cmdpath" "$prev")"
    [[ -n "$values" ]] && COMPREPLY=($(compgen -W "$values" -- "$cur"))
    return 0
  fi
  if [[ "$cur" == -* ]]; then
    COMPREPLY=($(compgen -W "$(_fleetprof_options "$cmdpath")" -- "$cur"))
  else
    COMPREPLY=($(compgen -W "$(_fleetprof_subcommands "$cmdpath")" -- "$cur"))
  fi
}
complete -o default -o bashdefault -F _fleetprof fleetprof
"""

ZSH_MAIN = """\
_fleetprof() {
  local cur="${words[CURRENT]}" prev="${words[CURRENT-1]}" cmdpath
  local -a values
  cmdpath="$(_fleetprof_path "${(@)words[1,CURRENT-1]}")"
  if [[ "$cmdpath" == "--" ]]; then
    local dashes=${words[(i)--]}
    shift $dashes words
    (( CURRENT -= dashes ))
    _normal
    return
  fi
  if [[ "$prev" == -* && "$prev" != *=* ]] && _fleetprof_takes_value "$cmdpath" "$prev"; then
    values=(${=$(_fleetprof_choices "$cmdpath" "$prev")})
    if (( $#values )); then compadd -a values; else _files; fi
    return
  fi
  if [[ "$cur" == -* ]]; then
    values=(${=$(_fleetprof_options "$cmdpath")})
    compadd -a values
  else
    values=(${=$(_fleetprof_subcommands "$cmdpath")})
    if (( $#values )); then compadd -a values; else _files; fi
  fi
}
compdef _fleetprof fleetprof
"""


def script(shell: str, parser: argparse.ArgumentParser) -> str:
    head = f"# fleetprof {shell} completion, generated from its argparse parsers by `fleetprof completion {shell}`.\n"
    main = BASH_MAIN if shell == "bash" else ZSH_MAIN
    return head + _tables(command_tree(parser)) + "\n" + main


def run(args: argparse.Namespace) -> int:
    print(script(args.shell, build_parser()), end="")
    return 0
