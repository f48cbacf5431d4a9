"""A loop without an optimizer that marks its steps through the explicit API."""

import torch
from torch import nn

from agent.hooks import fleetprof_step

model = nn.Sequential(nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 1))
for _ in range(4):
    loss = model(torch.randn(5, 8)).sum()
    loss.backward()
    with torch.no_grad():
        for p in model.parameters():
            p -= 0.01 * p.grad
            p.grad = None
    fleetprof_step()
print("EXPLICIT_DONE", flush=True)
