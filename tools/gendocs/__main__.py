"""`python -m tools.gendocs [--check]`: write the generated references, or check that they are current."""

from __future__ import annotations

import argparse
import logging
import sys

from tools.gendocs import COMMAND, REPO_ROOT, config, render_all, stale

log = logging.getLogger("tools.gendocs")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.gendocs", description=__doc__)
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 if a generated file is stale")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    # Imported modules log at start-up; this tool's output is its own lines only.
    logging.getLogger().setLevel(logging.WARNING)
    log.setLevel(logging.INFO)
    for name in config.undocumented():
        log.warning("setting %s has neither a description nor a comment: docs/configuration.md says '—'", name)
    if args.check:
        out_of_date = stale()
        for path in out_of_date:
            log.error("%s is out of date with the code: run `%s`", path, COMMAND)
        return 1 if out_of_date else 0
    for path, text in render_all().items():
        target = REPO_ROOT / path
        if not target.is_file() or target.read_text() != text:
            target.write_text(text)
            log.info("wrote %s", path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
