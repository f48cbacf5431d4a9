"""Errors shared by every CLI command."""


class CliError(Exception):
    """A user-facing error: printed to stderr without a traceback, exit status 2."""
