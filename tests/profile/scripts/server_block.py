"""Server mode: FLEETPROF_SERVER_URL and FLEETPROF_TOKEN set; argv: job id, steps."""

import json
import sys

import torch

import fleetprof

model = torch.nn.Linear(16, 4)
opt = torch.optim.Adam(model.parameters())
with fleetprof.profile(job_id=sys.argv[1], team="vision", name="server-mode") as block:
    for _ in range(int(sys.argv[2])):
        loss = model(torch.randn(4, 16)).sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
r = block.result
print(json.dumps({"job_id": r.job_id, "mode": r.mode, "json": str(r.report_json_path), "hooks": r.hooks}))
