"""Model factories the estimate tests name as 'tests.estimate.factories:...' (imported in the worker)."""

from __future__ import annotations

import time

from torch import nn


def mlp(width: int = 64, depth: int = 2, num_classes: int = 10) -> nn.Module:
    layers: list[nn.Module] = []
    for _ in range(depth):
        layers += [nn.Linear(width, width), nn.ReLU()]
    return nn.Sequential(*layers, nn.Linear(width, num_classes))


def raising() -> nn.Module:
    raise RuntimeError("weights file missing")


def sleeping(seconds: float = 3600.0) -> nn.Module:
    time.sleep(seconds)
    return mlp()


def not_a_module() -> str:
    return "model"
