"""A plain PyTorch CPU training loop that knows nothing of fleetprof, whose steps can slow down midway.

    python train_slowing.py STEPS STEP_S [SLOW_AT FACTOR [SLOW_AT2 FACTOR2]]

Each step trains a small MLP on random data and then sleeps up to STEP_S seconds (wall time per step); from step
SLOW_AT on the step takes FACTOR times as long, from SLOW_AT2 on FACTOR2 times. Prints its pid once and `STEP i`.
"""

import os
import sys
import time

import torch
from torch import nn

torch.manual_seed(0)
torch.set_num_threads(1)
steps, step_s = int(sys.argv[1]), float(sys.argv[2])
changes = [(int(sys.argv[i]), float(sys.argv[i + 1])) for i in range(3, len(sys.argv) - 1, 2)]
print(f"PID {os.getpid()}", flush=True)
model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x, y = torch.randn(32, 64), torch.randint(0, 10, (32,))
for i in range(steps):
    t0 = time.perf_counter()
    factor = 1.0
    for at, f in changes:
        if i >= at:
            factor = f
    opt.zero_grad()
    nn.functional.cross_entropy(model(x), y).backward()
    opt.step()
    time.sleep(max(0.0, step_s * factor - (time.perf_counter() - t0)))
    print(f"STEP {i}", flush=True)
