"""A plain PyTorch training loop that runs until told to stop: it knows nothing of fleetprof.

Usage: train_long.py STOP_FILE [MAX_STEPS]. Trains a small CNN on CPU, one step every ~10 ms or more, until
STOP_FILE exists (checked each step) or MAX_STEPS (default 3000) steps are done; then prints `STEPS <n>`.
"""

import os
import sys
import time

import torch
from torch import nn

torch.manual_seed(0)
torch.set_num_threads(1)
STOP = sys.argv[1]
MAX_STEPS = int(sys.argv[2]) if len(sys.argv) > 2 else 3000

model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(2), nn.Flatten(),
                      nn.Linear(32, 10))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x, y = torch.randn(4, 3, 16, 16), torch.randint(0, 10, (4,))
step = 0
while step < MAX_STEPS and not os.path.exists(STOP):
    opt.zero_grad()
    nn.functional.cross_entropy(model(x), y).backward()
    opt.step()
    step += 1
    time.sleep(0.01)
print(f"STEPS {step}", flush=True)
