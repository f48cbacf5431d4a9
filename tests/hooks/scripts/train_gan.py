"""Two optimizers stepping in every iteration (a toy GAN), then a loop with no optimizer and explicit steps."""

import torch
from torch import nn

torch.manual_seed(0)
gen = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
disc = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 1))
opt_g = torch.optim.Adam(gen.parameters(), lr=1e-3)
opt_d = torch.optim.Adam(disc.parameters(), lr=1e-3)
bce = nn.BCEWithLogitsLoss()
ITERS = 6
for _ in range(ITERS):
    z = torch.randn(32, 8)
    real = torch.randn(32, 4)
    fake = gen(z)
    opt_d.zero_grad()
    d_loss = bce(disc(real), torch.ones(32, 1)) + bce(disc(fake.detach()), torch.zeros(32, 1))
    d_loss.backward()
    opt_d.step()
    opt_g.zero_grad()
    bce(disc(fake), torch.ones(32, 1)).backward()
    opt_g.step()
print("GAN_DONE", ITERS, flush=True)
