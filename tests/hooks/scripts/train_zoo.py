"""A plain PyTorch training loop over a model of the estimator's zoo (what a team would train): it knows nothing
of fleetprof. Usage: train_zoo.py FACTORY OPTIMIZER BATCH [--wrapped] with OPTIMIZER one of sgd, adamw.
`--wrapped`: the model runs inside torch.nn.DataParallel (on CPU: a plain pass-through wrapper)."""

import sys

import torch

from server.estimate import zoo

torch.manual_seed(0)
torch.set_num_threads(1)
FACTORY, OPTIMIZER, BATCH = sys.argv[1], sys.argv[2], int(sys.argv[3])
model = getattr(zoo, FACTORY)()
params = list(model.parameters())
opt = torch.optim.SGD(params, lr=0.01) if OPTIMIZER == "sgd" else torch.optim.AdamW(params, lr=1e-4)
net = torch.nn.DataParallel(model) if "--wrapped" in sys.argv else model
x, y = torch.randn(BATCH, 3, 32, 32), torch.randint(0, 10, (BATCH,))
for _ in range(3):
    opt.zero_grad()
    torch.nn.functional.cross_entropy(net(x), y).backward()
    opt.step()
