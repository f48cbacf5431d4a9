"""A plain PyTorch transformer-encoder training script whose sequence length changes every step (64..1024
tokens): the allocation pattern that fragments CUDA's caching allocator. It knows nothing of fleetprof.

    python train_varlen.py STEPS [cuda|cpu]
"""

import random
import sys

import torch
from torch import nn

torch.manual_seed(0)
random.seed(0)
STEPS = int(sys.argv[1]) if len(sys.argv) > 1 else 40
DEVICE = sys.argv[2] if len(sys.argv) > 2 else "cuda"
BATCH, WIDTH, VOCAB = 16, 512, 8000

layer = nn.TransformerEncoderLayer(WIDTH, nhead=8, dim_feedforward=4 * WIDTH, batch_first=True)
model = nn.Sequential(nn.Embedding(VOCAB, WIDTH), nn.TransformerEncoder(layer, num_layers=4),
                      nn.Linear(WIDTH, VOCAB)).to(DEVICE)
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
loss_fn = nn.CrossEntropyLoss()
for step in range(STEPS):
    seq = random.choice((64, 96, 160, 256, 384, 512, 768, 1024))
    x = torch.randint(0, VOCAB, (BATCH, seq), device=DEVICE)
    opt.zero_grad(set_to_none=True)
    loss = loss_fn(model(x).flatten(0, 1), x.flatten())
    loss.backward()
    opt.step()
    if DEVICE != "cpu":
        torch.cuda.synchronize()
    print(f"STEP {step} seq {seq} loss {loss.item():.3f}", flush=True)
