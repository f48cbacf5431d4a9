"""`fleetprof estimate`: ask the server, before a job runs, how much GPU memory it needs, which GPU types it
fits, the largest batch that fits each, and time/energy per step.

    fleetprof estimate --hf-config gpt2 --seq-len 1024 --batch-size 8 --precision amp_bf16
    fleetprof estimate --factory server.estimate.zoo:resnet50 --input 3,224,224 --batch-size 64

The server imports only the built-in zoo and factories an operator registered (`fleetprof models add`). A team's
own model code is estimated with `--local`: the same estimator in this process, on this machine (PyTorch needed:
the `estimate` extra), importing the factory from the current directory or PYTHONPATH; nothing is sent unless
`--job-id` asks to store the result with that job (POST /api/v1/jobs, `metadata.estimate`).

This module is the command without the estimator: arguments, the request, the REST call, the table. `--local`
needs an estimator in this process, which the bare install does not have; the command as installed
(embedded/estimate.py) passes the server's estimator in (`run(args, local=...)`).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from typing import Any

from fleetprof import units
from fleetprof.commands.common import add_server_arguments, api_client
from fleetprof.errors import CliError

OPTIMIZERS = ["sgd", "sgd_momentum", "adam", "adamw", "adagrad", "rmsprop"]
PRECISIONS = ["fp32", "amp_fp16", "amp_bf16"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    model = parser.add_mutually_exclusive_group(required=True)
    model.add_argument("--factory", help="importable 'package.module:function' returning an nn.Module")
    model.add_argument("--hf-config", help="Hugging Face model type or config name (e.g. gpt2), or a JSON config")
    parser.add_argument("--kwargs", default="{}", help="JSON keyword arguments for --factory")
    parser.add_argument("--input", action="append", default=[], metavar="SHAPE[:DTYPE]",
                        help="one input's shape without the batch dimension, e.g. 3,224,224:float32 (repeatable)")
    parser.add_argument("--seq-len", type=int, help="token sequence length for text models")
    parser.add_argument("--batch-size", type=int, required=True, help="micro-batch per GPU")
    parser.add_argument("--optimizer", choices=OPTIMIZERS, default="adamw")
    parser.add_argument("--precision", choices=PRECISIONS, default="fp32")
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda",
                        help="the device the job trains on: cuda (per GPU type) or cpu (a plain CPU loop)")
    parser.add_argument("--grad-accumulation", type=int, default=1)
    parser.add_argument("--activation-checkpointing", action="store_true")
    parser.add_argument("--gpu", action="append", dest="gpus", metavar="TYPE", help="GPU type(s) from the catalogue")
    parser.add_argument("--no-search", action="store_true", help="skip the largest-batch search")
    parser.add_argument("--timeout", type=float, default=120.0, help="server-side time limit (s)")
    parser.add_argument("--local", action="store_true",
                        help="estimate here, in this process (your own code: any importable factory); needs PyTorch")
    parser.add_argument("--step", metavar="MODULE:FUNCTION",
                        help="with --local: your own training step in place of the canned one; FUNCTION(model) "
                             "returns step(*inputs) doing forward, loss, backward and optimizer step(s) "
                             "(docs/guide-teams.md)")
    parser.add_argument("--explain", action="store_true",
                        help="with --local: run the traced step and a real CPU step side by side and name where their "
                             "allocations first diverge (op, module, sizes)")
    parser.add_argument("--job-id", help="with --local: store the result with this job (its metadata.estimate)")
    parser.add_argument("--team", help="with --job-id: the job's team (a team token implies its own)")
    parser.add_argument("--format", choices=["table", "json"], default="table")
    add_server_arguments(parser)


def _parse_input(text: str) -> dict[str, Any]:
    shape, _, dtype = text.partition(":")
    try:
        dims = [int(d) for d in shape.split(",") if d.strip()]
    except ValueError:
        raise CliError(f"--input {text!r}: the shape must be comma-separated integers, e.g. 3,224,224") from None
    return {"shape": dims, "dtype": dtype or "float32"}


def build_request(args: argparse.Namespace) -> dict[str, Any]:
    try:
        kwargs = json.loads(args.kwargs)
    except json.JSONDecodeError as exc:
        raise CliError(f"--kwargs is not JSON: {exc}") from None
    if args.factory:
        model: dict[str, Any] = {"factory": args.factory, "kwargs": kwargs}
    else:
        hf: Any = args.hf_config
        if hf.lstrip().startswith("{"):
            try:
                hf = json.loads(hf)
            except json.JSONDecodeError as exc:
                raise CliError(f"--hf-config is not valid JSON: {exc}") from None
        model = {"hf_config": hf}
    req: dict[str, Any] = {"model": model, "batch_size": args.batch_size, "optimizer": args.optimizer,
                           "precision": args.precision, "device": args.device,
                           "grad_accumulation": args.grad_accumulation,
                           "activation_checkpointing": args.activation_checkpointing,
                           "search_max_batch": not args.no_search}
    if args.input:
        req["inputs"] = [_parse_input(t) for t in args.input]
    if args.seq_len:
        req["seq_len"] = args.seq_len
    if args.gpus:
        req["gpu_types"] = args.gpus
    return req


def format_table(est: dict[str, Any]) -> str:
    lines = [f"{est['model_name']}: {est['parameter_count']:,} parameters, batch {est['batch_size']}, "
             f"{est['precision']}, {est['optimizer']}",
             f"  peak allocated {units.gib(est['peak_allocated_bytes'])}, "
             f"peak reserved {units.gib(est['peak_reserved_bytes'])} "
             + ("(CPU: no caching, no rounding)" if est.get("device") == "cpu"
                else "(simulated CUDA caching allocator)"),
             "",
             f"  {'GPU':<12}{'fits':<6}{'device total':>14}{'headroom':>14}{'max batch':>11}{'step time':>12}"
             f"{'energy/step':>13}"]
    for g in est.get("gpus", []):
        r = g["roofline"]
        mb = g["max_batch_size"]
        max_batch = (str(mb) + ("" if g["max_batch_size_exact"] else "+")) if mb else "-"
        lines.append(f"  {g['gpu']:<12}{'yes' if g['fits'] else 'NO':<6}{units.gib(g['device_total_bytes']):>14}"
                     f"{units.gib(g['headroom_bytes']):>14}{max_batch:>11}"
                     f"{units.seconds(r['time_per_step_s']):>12}{units.energy(r['energy_per_step_j']):>13}")
    for a in est.get("assumptions", [])[:8]:
        lines.append(f"  note: {a}")
    return "\n".join(lines) + "\n"


def upload_body(est: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    """The POST /api/v1/jobs body that stores a local estimate with its job: metadata.estimate."""
    body: dict[str, Any] = {"job_id": args.job_id, "metadata": {"estimate": {
        **est, "source": "fleetprof estimate --local", "estimated_at": time.time()}}}
    if args.team:
        body["team"] = args.team
    return body


LocalEstimator = Callable[[dict[str, Any], float, str | None], dict[str, Any]]
LocalExplainer = Callable[[dict[str, Any]], str]  # --local --explain: the comparison, as text
"""(request, time limit in s) -> the estimate, computed in this process."""


def run(args: argparse.Namespace, local: LocalEstimator | None = None,
        explain: LocalExplainer | None = None) -> int:
    req = build_request(args)
    if args.explain:
        if not args.local:
            raise CliError("--explain runs the model here: add --local")
        if explain is None:
            raise CliError("--explain needs the estimator, which this install lacks "
                           "(pip install 'fleetprof[estimate]')")
        sys.stdout.write(explain(req))
        return 0
    if (args.job_id or args.team) and not args.local:
        raise CliError("--job-id and --team store a --local estimate; the server's estimates are not stored")
    if args.step and not args.local:
        raise CliError("--step runs your own training code: it needs --local (the server never imports code a "
                       "request names)")
    if not args.local:
        with api_client(args.server, args.token) as api:
            est = api.estimate(req, timeout_s=args.timeout)
    else:
        if local is None:
            raise CliError("--local needs the estimator, which this install lacks (pip install 'fleetprof[estimate]')")
        est = local(req, args.timeout, args.step)
        if args.job_id:
            with api_client(args.server, args.token) as api:
                api.register_job(upload_body(est, args))
    sys.stdout.write(json.dumps(est, indent=2) + "\n" if args.format == "json" else format_table(est))
    if args.local and args.job_id:
        sys.stderr.write(f"stored with job {args.job_id} (GET /api/v1/jobs/{args.job_id}: metadata.estimate)\n")
    return 0
