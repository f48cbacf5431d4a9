"""`fleetprof db upgrade|downgrade REV|current`: schema migrations (Alembic)."""

from __future__ import annotations

import argparse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="db_command", required=True, metavar="ACTION")
    up = sub.add_parser("upgrade", help="migrate the database to the latest schema (or --revision)")
    up.add_argument("--revision", default="head")
    down = sub.add_parser("downgrade", help="migrate down to REVISION (e.g. base)")
    down.add_argument("revision")
    sub.add_parser("current", help="print the current revision")


def run(args: argparse.Namespace) -> int:
    from alembic import command
    from sqlalchemy.exc import OperationalError

    from fleetprof.errors import CliError
    from server.config import get_settings
    from server.migrate import alembic_config, downgrade, upgrade

    settings = get_settings()
    try:
        if args.db_command == "upgrade":
            upgrade(settings, args.revision)
            print(f"database at {args.revision} ({'embedded sqlite' if settings.embedded else 'postgres'})")
        elif args.db_command == "downgrade":
            downgrade(settings, args.revision)
        else:
            command.current(alembic_config(settings))
    except OperationalError as exc:  # the driver's first line says why (refused, unknown host, no such database)
        raise CliError(f"cannot reach the database: {str(exc.orig).strip().splitlines()[0]}") from None
    return 0
