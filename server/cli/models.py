"""`fleetprof models add|list|remove`: the model factories pre-training estimates may import (operator).

An estimate request names a Hugging Face config, a factory of the built-in zoo, or one registered here; nothing
else is imported. A registered factory is still built only inside the estimate sandbox (no database or broker
credentials, resource limits, a scratch directory of its own). It must be importable by the estimate workers
(installed in the server's environment); `add` stores the name and imports nothing.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from server.cli.session import in_session

if TYPE_CHECKING:
    from sqlalchemy.orm import Session


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="models_command", required=True, metavar="ACTION")
    add = sub.add_parser("add", help="allow estimates to import FACTORY ('package.module:function')")
    add.add_argument("factory", metavar="FACTORY")
    add.add_argument("--description")
    sub.add_parser("list", help="the registered factories and the built-in zoo")
    remove = sub.add_parser("remove", help="stop allowing FACTORY")
    remove.add_argument("factory", metavar="FACTORY")


def run(args: argparse.Namespace) -> int:
    from fleetprof import units
    from fleetprof.commands.tables import aligned
    from server.estimate import registry
    from server.estimate.allowlist import ZOO_FACTORIES
    from server.models.base import to_epoch

    if args.models_command == "add":
        in_session(lambda s: registry.add_model(s, factory=args.factory, description=args.description))
        print(f"registered {args.factory}")
    elif args.models_command == "remove":
        in_session(lambda s: registry.remove_model(s, factory=args.factory))
        print(f"removed {args.factory}")
    else:
        def rows(session: Session) -> list[list[str]]:
            return [[m.factory, "registered", m.description or "-", units.timestamp(to_epoch(m.created_at))]
                    for m in registry.list_models(session)]

        zoo = [[f, "built-in zoo", "-", "-"] for f in sorted(ZOO_FACTORIES)]
        print("\n".join(aligned(["factory", "source", "description", "registered"], in_session(rows) + zoo)))
    return 0
