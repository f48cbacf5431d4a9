"""`fleetprof token create|list|revoke`: API tokens, on the database of FLEETPROF_DATABASE_URL (embedded by default).

`create --scope SCOPE [--team T] [--node N]` prints a new token alone on its last line; `list [--all]` shows
each token's id, prefix (its first 10 characters), scope and binding, never the token; `revoke ID` or
`revoke --token TOKEN` refuses it from then on (a collector that cached it within the last 30 s too, once its entry
expires). Each takes `--format json`: stdout then holds one JSON object (`list`: a list) and nothing else.
A token id or token that does not exist exits 3, other refusals 2 (fleetprof.errors)."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from fleetprof.errors import CliError
from fleetprof.output import add_format_argument, write_json
from server.cli.session import in_session

if TYPE_CHECKING:
    from sqlalchemy.orm import Session


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="token_command", required=True, metavar="ACTION")
    create = sub.add_parser("create", help="create a token (shown once; stored hashed)")
    create.add_argument("--scope", required=True, choices=["agent", "team", "scheduler", "operator"])
    create.add_argument("--team", help="team of a team token")
    create.add_argument("--node", help="node an agent token may write for ('*' for any)")
    create.add_argument("--description")
    add_format_argument(create)
    listing = sub.add_parser("list", help="list tokens (id, prefix, scope, team, node; never the token)")
    listing.add_argument("--all", action="store_true", help="include revoked tokens")
    add_format_argument(listing)
    revoke = sub.add_parser("revoke", help="revoke a token by its id (see `list`) or by the token itself")
    revoke.add_argument("token_id", nargs="?", type=int, metavar="ID")
    revoke.add_argument("--token", help="the token itself (read from the environment is safer: FLEETPROF_TOKEN)")
    add_format_argument(revoke)


def create_token_now(scope: str, team: str | None = None, node: str | None = None,
                     description: str | None = None) -> str:
    from server.auth.service import create_token

    return in_session(lambda s: create_token(s, scope=scope, team=team, node=node, description=description))


def _list(include_revoked: bool, fmt: str) -> int:
    from fleetprof import units
    from fleetprof.commands.tables import aligned
    from server.auth.service import list_tokens
    from server.models.base import to_epoch

    def rows(session: Session) -> list[dict[str, Any]]:
        return [{"id": t.id, "prefix": t.prefix, "scope": t.scope, "team": t.team, "node": t.node,
                 "description": t.description, "created_at": to_epoch(t.created_at),
                 "revoked_at": to_epoch(t.revoked_at)}
                for t in list_tokens(session, include_revoked=include_revoked)]

    tokens = in_session(rows)
    if fmt == "json":
        write_json(tokens)
        return 0
    header = ["id", "prefix", "scope", "team", "node", "description", "created", "revoked"]
    print("\n".join(aligned(header, [
        [str(t["id"]), f"{t['prefix']}...", t["scope"], t["team"] or "-", t["node"] or "-", t["description"] or "-",
         units.timestamp(t["created_at"]), units.timestamp(t["revoked_at"]) if t["revoked_at"] else "-"]
        for t in tokens])))
    return 0


def _revoke(token_id: int | None, token: str | None, fmt: str) -> int:
    from server.auth.service import revoke_token

    def work(session: Session) -> tuple[int, str, bool]:
        row, now = revoke_token(session, token_id=token_id, token=token)
        return row.id, row.prefix, now

    tid, prefix, now = in_session(work)
    if fmt == "json":
        write_json({"id": tid, "prefix": prefix, "revoked": True, "revoked_now": now})
    else:
        print(f"token {tid} ({prefix}...) " + ("revoked" if now else "was already revoked"))
    return 0


def run(args: argparse.Namespace) -> int:
    if args.token_command == "list":
        return _list(args.all, args.format)
    if args.token_command == "revoke":
        if (args.token_id is None) == (args.token is None):
            raise CliError("revoke takes a token id (see `fleetprof token list`) or --token TOKEN, one of the two")
        return _revoke(args.token_id, args.token, args.format)
    token = create_token_now(args.scope, args.team, args.node, args.description)
    if args.format == "json":
        write_json({"token": token, "scope": args.scope, "team": args.team, "node": args.node,
                    "description": args.description})
        return 0
    print(f"scope={args.scope} team={args.team or '-'} node={args.node or '-'} (store it now: it is not shown again)")
    print(token)
    return 0
