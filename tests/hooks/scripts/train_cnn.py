"""A plain PyTorch training script: it knows nothing of fleetprof. Prints its own per-step times."""

import sys
import time

import torch
from torch import nn

torch.manual_seed(0)
torch.set_num_threads(1)
STEPS = int(sys.argv[1]) if len(sys.argv) > 1 else 8
DEVICE = sys.argv[2] if len(sys.argv) > 2 else "cpu"


class SmallCNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 16, 3, padding=1)
        self.act1 = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(16, 16, 3, padding=1)
        self.act2 = nn.ReLU(inplace=True)
        self.pool = nn.AdaptiveAvgPool2d(4)
        self.head = nn.Linear(16 * 4 * 4, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.act1(self.conv1(x))
        x = self.act2(self.conv2(x))
        return self.head(self.pool(x).flatten(1))


model = SmallCNN().to(DEVICE)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
loss_fn = nn.CrossEntropyLoss()
x = torch.randn(24, 3, 48, 48, device=DEVICE)
y = torch.randint(0, 10, (24,), device=DEVICE)
t_loop = time.perf_counter()
for i in range(STEPS):
    t0 = time.perf_counter()
    opt.zero_grad()
    loss_fn(model(x), y).backward()
    opt.step()
    if DEVICE != "cpu":
        torch.cuda.synchronize()  # the script's own timing must cover the device work
    print(f"STEP {i} {time.perf_counter() - t0:.6f}", flush=True)
print(f"LOOP {time.perf_counter() - t_loop:.6f}", flush=True)
