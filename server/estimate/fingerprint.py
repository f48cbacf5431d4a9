"""The estimated model's fingerprint: the same rule as the training hooks (fleetprof/fingerprint.py), over the
module the estimator builds, so an estimate and the runs of that model share one id (GET /jobs?fingerprint=)."""

from __future__ import annotations

import logging

import torch

from fleetprof.fingerprint import describe_module, fingerprint_id, model_class, tree_hash
from fleetprof.report import FingerprintSection
from server.estimate.step import make_optimizer


def optimizer_class(name: str) -> str:
    """The class name of the optimizer the estimator steps for `name` (what the hooks see in a real run)."""
    probe = torch.nn.Parameter(torch.empty(1, device="meta"))
    return type(make_optimizer(name, [probe])).__name__


log = logging.getLogger(__name__)


def estimate_fingerprint(model: torch.nn.Module, *, optimizer: str | None, precision: str,
                         batch_size: int) -> FingerprintSection | None:
    """`optimizer`: the request's (None when a caller's own step chose its own: then the id is unknown). None when
    the module cannot be described (e.g. a lazy module's parameter still uninitialized): the estimate goes on."""
    try:
        tree = describe_module(model)
    except Exception:
        log.warning("no fingerprint for %s", type(model).__qualname__, exc_info=True)
        return None
    module_tree_hash = tree_hash(tree)
    optimizers = None if optimizer is None else [optimizer_class(optimizer)]
    return FingerprintSection(
        fingerprint=None if optimizers is None else fingerprint_id(module_tree_hash, optimizers),
        module_tree_hash=module_tree_hash, module_count=len(tree.modules), model_class=model_class(model),
        parameter_count=tree.parameter_count, optimizers=optimizers, precision=precision, batch_size=batch_size,
        framework="pytorch", framework_version=torch.__version__, source="estimate")
