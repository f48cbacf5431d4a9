"""A plain PyTorch training script with a DataLoader: it knows nothing of fleetprof.

Usage: train_loader.py BATCH_SIZE [STEPS] [--autocast]. Prints `BATCH <n>` (its own batch size) and `PARAMS <n>`.
The dataset's length is not a multiple of the batch size, so an epoch ends with a short batch.
"""

import sys

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(0)
torch.set_num_threads(1)
BATCH = int(sys.argv[1])
STEPS = int(sys.argv[2]) if len(sys.argv) > 2 and not sys.argv[2].startswith("--") else 6
AUTOCAST = "--autocast" in sys.argv


class ConvNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 16, 3, padding=1)
        self.conv2 = nn.Conv2d(16, 16, 3, padding=1)
        self.head = nn.Linear(16 * 4 * 4, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.conv2(torch.relu(self.conv1(x))))
        return self.head(nn.functional.adaptive_avg_pool2d(x, 4).flatten(1))


model = ConvNet()
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
loss_fn = nn.CrossEntropyLoss()
data = TensorDataset(torch.randn(BATCH * 3 + 1, 3, 64, 64), torch.randint(0, 10, (BATCH * 3 + 1,)))
loader = DataLoader(data, batch_size=BATCH, shuffle=True)
print(f"BATCH {BATCH}", flush=True)
print(f"PARAMS {sum(p.numel() for p in model.parameters())}", flush=True)
step = 0
while step < STEPS:
    for x, y in loader:
        opt.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=AUTOCAST):
            loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        step += 1
        if step >= STEPS:
            break
