"""Training steps of a user's own, as `fleetprof estimate --local --step tests.estimate.user_steps:...` names them
(the examples of docs/guide-teams.md, "Your own training step"), and the models they train."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn


class GAN(nn.Module):
    def __init__(self, latent: int = 64, width: int = 256, features: int = 128) -> None:
        super().__init__()
        self.latent = latent
        self.generator = nn.Sequential(nn.Linear(latent, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(),
                                       nn.Linear(width, features))
        self.discriminator = nn.Sequential(nn.Linear(features, width), nn.LeakyReLU(0.2), nn.Linear(width, 1))


def gan(latent: int = 64, width: int = 256, features: int = 128) -> GAN:
    return GAN(latent, width, features)


def classifier(width: int = 256, depth: int = 3, classes: int = 100) -> nn.Module:
    layers: list[nn.Module] = []
    for _ in range(depth):
        layers += [nn.Linear(width, width), nn.GELU()]
    return nn.Sequential(*layers, nn.Linear(width, classes))


def gan_step(model: GAN) -> Callable[[torch.Tensor], None]:
    """A GAN's two updates: the discriminator on real and (detached) fake samples, then the generator."""
    opt_d = torch.optim.Adam(model.discriminator.parameters(), lr=2e-4, betas=(0.5, 0.999))
    opt_g = torch.optim.Adam(model.generator.parameters(), lr=2e-4, betas=(0.5, 0.999))

    def step(real: torch.Tensor) -> None:
        n = real.shape[0]
        z = torch.randn(n, model.latent, device=real.device)
        fake = model.generator(z)
        ones = torch.ones(n, 1, device=real.device)
        zeros = torch.zeros(n, 1, device=real.device)
        d_loss = (F.binary_cross_entropy_with_logits(model.discriminator(real), ones)
                  + F.binary_cross_entropy_with_logits(model.discriminator(fake.detach()), zeros))
        opt_d.zero_grad(set_to_none=True)
        d_loss.backward()
        opt_d.step()
        g_loss = F.binary_cross_entropy_with_logits(model.discriminator(fake), ones)
        opt_g.zero_grad(set_to_none=True)
        g_loss.backward()
        opt_g.step()

    return step


def clipped_step(model: nn.Module) -> Callable[[torch.Tensor], None]:
    """SGD with momentum and gradient clipping by global norm."""
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)

    def step(x: torch.Tensor) -> None:
        logits = model(x)
        targets = torch.randint(0, logits.shape[1], (x.shape[0],), device=x.device)
        F.cross_entropy(logits, targets).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def custom_loss_step(model: nn.Module) -> Callable[[torch.Tensor], None]:
    """Label smoothing, a confidence penalty on the softmax and an explicit L2 term, with AdamW."""
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    params = list(model.parameters())

    def step(x: torch.Tensor) -> None:
        logits = model(x)
        targets = torch.randint(0, logits.shape[1], (x.shape[0],), device=x.device)
        probs = logits.softmax(dim=-1)
        entropy = -(probs * probs.clamp_min(1e-9).log()).sum(dim=-1).mean()
        l2 = sum(p.pow(2).sum() for p in params)
        loss = F.cross_entropy(logits, targets, label_smoothing=0.1) - 0.1 * entropy + 1e-4 * l2
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def amp_step(model: nn.Module) -> Callable[[torch.Tensor], None]:
    """The clipped step's loss under bf16 autocast, written as on a GPU: `torch.autocast("cuda", ...)`."""
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def step(x: torch.Tensor) -> None:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = model(x)
            targets = torch.randint(0, logits.shape[1], (x.shape[0],), device=x.device)
            loss = F.cross_entropy(logits, targets)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def not_a_step(model: nn.Module) -> int:
    return 3
