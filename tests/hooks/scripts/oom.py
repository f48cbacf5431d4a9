"""Two optimizer steps, then an out-of-memory error that ends the program."""

import torch
from torch import nn

model = nn.Linear(4, 4)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(2):
    model(torch.randn(2, 4)).sum().backward()
    opt.step()
raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 MiB (GPU 0; 1.00 GiB total capacity)")
