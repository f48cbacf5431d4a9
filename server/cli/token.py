"""`fleetprof token create --scope SCOPE [--team T] [--node N]`: prints a new token alone on its last line."""

from __future__ import annotations

import argparse

from fleetprof.errors import CliError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="token_command", required=True, metavar="ACTION")
    create = sub.add_parser("create", help="create a token (shown once; stored hashed)")
    create.add_argument("--scope", required=True, choices=["agent", "team", "scheduler", "operator"])
    create.add_argument("--team", help="team of a team token")
    create.add_argument("--node", help="node an agent token may write for ('*' for any)")
    create.add_argument("--description")


def create_token_now(scope: str, team: str | None = None, node: str | None = None,
                     description: str | None = None) -> str:
    from server.config import get_settings
    from server.db import make_engine, make_sessionmaker, session_scope
    from server.auth.service import create_token
    from server.errors import DomainError
    from server.migrate import upgrade

    settings = get_settings()
    if settings.embedded:
        upgrade(settings)
    engine = make_engine(settings)
    try:
        with session_scope(make_sessionmaker(engine)) as session:
            return create_token(session, scope=scope, team=team, node=node, description=description)
    except DomainError as exc:
        raise CliError(exc.message) from None
    finally:
        engine.dispose()


def run(args: argparse.Namespace) -> int:
    token = create_token_now(args.scope, args.team, args.node, args.description)
    print(f"scope={args.scope} team={args.team or '-'} node={args.node or '-'} (store it now: it is not shown again)")
    print(token)
    return 0
