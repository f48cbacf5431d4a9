"""A block inside a block: the inner one adds no second set of hooks (the outer profiler keeps counting the steps);
both jobs get a report. Prints the two results."""

import json

import torch

import fleetprof

model = torch.nn.Linear(8, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)


def steps(n):
    for _ in range(n):
        model(torch.randn(2, 8)).sum().backward()
        opt.step()
        opt.zero_grad()


with fleetprof.profile(name="outer") as outer:
    steps(4)
    with fleetprof.profile(name="inner") as inner:
        steps(3)
    steps(2)
for tag, block in (("outer", outer), ("inner", inner)):
    r = block.result
    print(json.dumps({"tag": tag, "hooks": r.hooks, "json": str(r.report_json_path)}))
