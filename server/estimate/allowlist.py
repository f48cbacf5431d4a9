"""Which model code an estimate may import: the one rule, checked by the API before it starts a worker and again
by the sandboxed worker before it imports anything (server.estimate.models).

A request never names code to run. It names a Hugging Face config (data), a factory of the built-in zoo, or a
factory an operator registered (`fleetprof models add module:function`, stored server-side). Anything else is
refused before any import. Registration itself refuses the standard library (`os:system`, `subprocess:run`,
`builtins:eval`, ...) and private or dunder names (`pkg.mod:os.system` reaches a module's own imports).
"""

from __future__ import annotations

import re
import sys
from collections.abc import Collection

from server.estimate.errors import UnknownModelError

_NAME = r"[A-Za-z][A-Za-z0-9_]*"
FACTORY_PATTERN = re.compile(rf"{_NAME}(?:\.{_NAME})*:{_NAME}")
MAX_FACTORY_CHARS = 200

# Public factories of the zoo (server/estimate/zoo/__init__.py, `__all__`): code of this repository, always allowed.
# Listed here, not imported: the API checks requests without importing torch (tests/estimate/test_zoo.py keeps the
# two lists equal).
ZOO_FACTORY_NAMES = (
    "clip", "convnext_tiny", "densenet121", "dlrm", "efficientnet_b0", "gat", "gcn", "gru", "lstm",
    "mha_classifier", "mlp_mixer", "mobilenet_v3", "resnet18", "resnet50", "resnet_small", "rnn_tanh", "tcn",
    "transformer_decoder_lm", "transformer_encoder", "transformer_seq2seq", "unet", "vgg16", "vgg_small",
    "whisper", "wide_and_deep",
)
ZOO_FACTORIES = frozenset(f"server.estimate.zoo:{name}" for name in ZOO_FACTORY_NAMES)


class RegistrationError(ValueError):
    """A factory an operator may not register; the message says why."""


def registrable(factory: str) -> str:
    """`factory` if an operator may register it, else RegistrationError. The function part is one public name
    of the module (no attribute paths: `pkg.mod:os.system` would reach whatever the module imported)."""
    if len(factory) > MAX_FACTORY_CHARS or not FACTORY_PATTERN.fullmatch(factory):
        raise RegistrationError(
            f"{factory[:MAX_FACTORY_CHARS]!r} is not 'package.module:function' (public names only, one function)"
        )
    top = factory.split(".", 1)[0].split(":", 1)[0]
    if top in sys.stdlib_module_names or top in sys.builtin_module_names:
        raise RegistrationError(f"{factory!r} is in the Python standard library, not a model definition")
    return factory


def check_allowed(factory: str, registered: Collection[str]) -> None:
    """Raise UnknownModelError (HTTP 422) unless `factory` is in the zoo or registered. Exact match only."""
    if factory in ZOO_FACTORIES or factory in registered:
        return
    zoo = ", ".join(sorted(ZOO_FACTORIES))
    raise UnknownModelError(
        f"factory {factory[:MAX_FACTORY_CHARS]!r} is not registered: an estimate imports only the built-in zoo "
        f"({zoo}) and factories an operator registered with `fleetprof models add module:function`; "
        "estimate your own code with `fleetprof estimate --local` on your machine"
    )
