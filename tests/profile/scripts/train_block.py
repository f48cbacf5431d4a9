"""A real PyTorch CPU training loop profiled by `fleetprof.profile()`: as a `with` block (argv[1] steps), then as a
decorated function called twice (argv[2] and argv[3] steps), then a block that raises. Prints one JSON line per
block: what the loop counted itself and what the block's result says."""

import json
import sys

import torch

import fleetprof

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)


def train(steps: int) -> int:
    done = 0
    for _ in range(steps):
        x = torch.randn(8, 32)
        loss = model(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        done += 1
    return done


def show(result, counted, tag):
    print(json.dumps({"tag": tag, "counted": counted, "job_id": result.job_id, "mode": result.mode,
                      "state": result.state, "hooks": result.hooks, "json": str(result.report_json_path),
                      "html": str(result.report_html_path)}), flush=True)


with fleetprof.profile(name="block-test", team="local-team") as block:
    counted = train(int(sys.argv[1]))
show(block.result, counted, "with")

decorated = fleetprof.profile(name="decorated-test")
train_profiled = decorated(train)
for steps in (int(sys.argv[2]), int(sys.argv[3])):
    counted = train_profiled(steps)
    show(decorated.result, counted, "decorator")

failing = fleetprof.profile(name="failing-test")
try:
    with failing:
        train(3)
        raise RuntimeError("the user's own error")
except RuntimeError as exc:
    assert str(exc) == "the user's own error"
show(failing.result, 3, "raised")
