"""Admission control for a GPU scheduler: estimate a training job before it launches and decide whether it fits.

    export FLEETPROF_SERVER_URL=http://collector:8000 FLEETPROF_TOKEN=fp_...   # a scheduler token
    python examples/scheduler_admission.py --gpu H100-80GB --batch-size 64 \
        --factory server.estimate.zoo:resnet50 --input 3,224,224

It asks the collector for a pre-training estimate (POST /api/v1/estimate, through the SDK: fleetprof.client) and
prints one JSON decision on stdout: `admit` when the job fits the requested GPU type at its batch size, else
`reject` with what would fit instead (the largest batch on that GPU, the GPU types it fits). Exit status 0 admits,
1 rejects, 2 means the estimate could not be had (bad request, token, unreachable server): a scheduler's
prolog can run it as it is.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from fleetprof.client import ApiError, Client

ADMIT, REJECT, NO_ESTIMATE = 0, 1, 2


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    model = parser.add_mutually_exclusive_group(required=True)
    model.add_argument("--factory", help="a factory of the built-in zoo or one the operator registered")
    model.add_argument("--hf-config", help="a Hugging Face model type, e.g. gpt2")
    parser.add_argument("--input", help="one input's shape without the batch dimension, e.g. 3,224,224")
    parser.add_argument("--seq-len", type=int, help="token sequence length (--hf-config)")
    parser.add_argument("--batch-size", type=int, required=True, help="micro-batch per GPU")
    parser.add_argument("--precision", default="fp32", choices=["fp32", "amp_fp16", "amp_bf16"])
    parser.add_argument("--gpu", required=True, help="the GPU type the job asks for (the server's catalogue)")
    return parser.parse_args(argv)


def estimate_request(args: argparse.Namespace) -> dict[str, Any]:
    model = {"factory": args.factory} if args.factory else {"hf_config": args.hf_config}
    request: dict[str, Any] = {"model": model, "batch_size": args.batch_size, "precision": args.precision,
                               "gpu_types": [args.gpu]}
    if args.input:
        request["inputs"] = [{"shape": [int(d) for d in args.input.split(",")]}]
    if args.seq_len:
        request["seq_len"] = args.seq_len
    return request


def decide(estimate: dict[str, Any], gpu: str) -> dict[str, Any]:
    """The decision for one GPU type, from the estimate's figures (bytes, seconds and joules per step)."""
    on_gpu = next(g for g in estimate["gpus"] if g["gpu"] == gpu)
    return {
        "decision": "admit" if on_gpu["fits"] else "reject",
        "gpu": gpu,
        "model": estimate["model_name"],
        "parameter_count": estimate["parameter_count"],
        "batch_size": estimate["batch_size"],
        "peak_allocated_bytes": estimate["peak_allocated_bytes"],
        "peak_reserved_bytes": estimate["peak_reserved_bytes"],
        "device_total_bytes": on_gpu["device_total_bytes"],
        "headroom_bytes": on_gpu["headroom_bytes"],
        "max_batch_size": on_gpu["max_batch_size"],
        "time_per_step_s": on_gpu["roofline"]["time_per_step_s"],
        "energy_per_step_j": on_gpu["roofline"]["energy_per_step_j"],
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        with Client.from_settings(timeout_s=60) as api:  # FLEETPROF_SERVER_URL, FLEETPROF_TOKEN
            estimate = api.estimate(estimate_request(args), timeout_s=120)
    except (ApiError, ValueError) as exc:
        print(f"no estimate: {exc}", file=sys.stderr)
        return NO_ESTIMATE
    decision = decide(estimate, args.gpu)
    print(json.dumps(decision, indent=2))
    return ADMIT if decision["decision"] == "admit" else REJECT


if __name__ == "__main__":
    sys.exit(main())
