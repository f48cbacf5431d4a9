"""Import the object a `package.module:attribute` string names: model factories (server.estimate.models, after the
allow-list check) and user training steps (server.estimate.user_step, `--local` only). One rule for both; each
caller turns the one-line reason into its own error type."""

from __future__ import annotations

import importlib
from typing import Any


class NamedCodeError(Exception):
    """The string is malformed, its module does not import, or the attribute is missing or not callable."""


def import_callable(spec: str, what: str) -> Any:
    """The callable `spec` ('package.module:function', dots allowed after the colon) names; `what` ("factory",
    "step") words the errors."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise NamedCodeError(f"{what} {spec!r} is not of the form 'package.module:function'")
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # ImportError, or the module raised while importing
        raise NamedCodeError(f"cannot import module {module_name!r} for {what} {spec!r}: {exc}") from exc
    found: Any = module
    for part in attr.split("."):
        found = getattr(found, part, None)
        if found is None:
            raise NamedCodeError(f"module {module_name!r} has no attribute {attr!r}")
    if not callable(found):
        raise NamedCodeError(f"{what} {spec!r} is not callable")
    return found
