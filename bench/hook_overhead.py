"""Step-time overhead of the fleetprof PyTorch hooks (issue 4, target: <= 2% at the default level).

Two real models train on random data: a small CNN and a small transformer encoder. In one process, blocks
of steps alternate between no hooks and each hooks level, so that machine noise (a shared CPU) falls on all
configurations alike. Hooks are the real ones (`agent.hooks.torch.Profiler`), shipping real event batches
over HTTP to a local sink process that answers like the collector.

Step time is measured twice: process CPU time (all threads of the training process, so the hooks' sender
thread is charged to the hooks) and wall time. On a shared machine the wall time of a 50-100 ms step
swings by +-20% with the other tenants' load; the CPU time does not, so the overhead is read from it.

    python bench/hook_overhead.py [--device cpu|cuda] [--rounds 6] [--steps 51] [--threads 1]

Prints: model, level, median step time without / with hooks (CPU, then wall), and the overhead: the median over rounds of
the per-round ratio of medians ("overhead %") and of means ("mean ovh %": it carries the cost of the sampled
per-module step, one in 50 at "layers/50", which the median hides). "layers/1" times every module on every
step: the worst case, not a setting anyone should run with.

Measured 2026-11-25 (wip/hooks), before = 4b49f1d, after = this branch; each row one run of
`python bench/hook_overhead.py --rounds 2` on the shared 2-core CPU dev machine (torch 2.13 CPU, load average
2-5: the per-model rows swing by +-20 % there, so only the trivial-step figures are read):

    trivial step, default level, per step       before (2 runs)    after (2 runs)
    wall, median step                           216 / 147 us       48 / 31 us
    process CPU, median step                    215 / 147 us       49 / 31 us
    process CPU, mean step (sender included)    519 / 274 us       92 / 51 us

Where it went (before): the sender thread posted every few events (it drained the queue to empty on each
wake-up: ~100 us of CPU per step, each post about 1 ms of HTTP and JSON), the RSS peak read per step
(/proc/self/status, 10-40 us), per-event pydantic validation and dump, the lock per put. On CUDA, measured on
the H100 (torch 2.11): the per-step peaks through max_memory_allocated() + max_memory_reserved() + reset took
221 us (both flatten the allocator's stats tree in Python), through one nested read + reset 11.7 us; a timing
event through torch.cuda.Event()+record() 9.3 us, through the bindings 3.5 us.

Live capture requests (issue #19): hooks-on blocks also poll for capture requests, every `--capture-poll-s` (0.05 s
here, 200 times the real default of 10 s, so that a cost would show); the trivial-step figure is then split into the
poll alone (default level with poll - without, same rounds). Measured 2026-11-26 (wip/caphooks), `--rounds 3 --models
cnn` on the shared 2-core CPU dev machine (load average ~5): poll alone 1.6 us wall / 1.3 us process CPU per median
step (the noise floor of this machine: the training thread reads one attribute per step outside capture windows),
22.3 us process CPU per mean step, i.e. the poll thread's own GETs at 20 Hz on ~100 us steps; at the real 10 s period
that is ~0.1 us per step. Whole default level in the same run: 34.6 us wall, 81.2 us mean CPU per step.
"""

from __future__ import annotations

import argparse
import collections
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
from torch import nn  # noqa: E402

from agent.hooks.sender import EventSender  # noqa: E402
from agent.hooks.torch import Profiler  # noqa: E402
from bench.report import write_report  # noqa: E402
from fleetprof.client import Client  # noqa: E402


class SmallCNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()

        def block(cin: int, cout: int) -> nn.Sequential:
            return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout),
                                 nn.ReLU(inplace=True), nn.MaxPool2d(2))

        self.features = nn.Sequential(block(3, 32), block(32, 64), block(64, 128))
        self.head = nn.Linear(128 * 4 * 4, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x).flatten(1))


class SmallTransformer(nn.Module):
    def __init__(self, vocab: int = 1000, d: int = 128, layers: int = 4, heads: int = 4) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        layer = nn.TransformerEncoderLayer(d, heads, dim_feedforward=4 * d, batch_first=True, dropout=0.0)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.lm_head = nn.Linear(d, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.encoder(self.embed(tokens)))


def make_cnn(device: str) -> tuple[nn.Module, Callable[[], None]]:
    model = SmallCNN().to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x = torch.randn(32, 3, 32, 32, device=device)
    y = torch.randint(0, 10, (32,), device=device)
    loss_fn = nn.CrossEntropyLoss()

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        loss_fn(model(x), y).backward()
        opt.step()

    return model, step


def make_transformer(device: str) -> tuple[nn.Module, Callable[[], None]]:
    model = SmallTransformer().to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    tokens = torch.randint(0, 1000, (8, 64), device=device)
    loss_fn = nn.CrossEntropyLoss()

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        logits = model(tokens[:, :-1])
        loss_fn(logits.reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1)).backward()
        opt.step()

    return model, step


_SINK = r"""
import json, sys, time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
class H(BaseHTTPRequestHandler):
    def do_GET(self):  # the hooks' poll for live capture requests: none asked for
        body = json.dumps({"captures": []}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
        print("GET", flush=True)
    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        body = json.dumps({"accepted": 1, "server_time": time.time()}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
        print("POST", flush=True)
    def log_message(self, *a):
        pass
s = ThreadingHTTPServer(("127.0.0.1", 0), H)
print(s.server_address[1], flush=True)
s.serve_forever()
"""


def start_sink() -> tuple[subprocess.Popen[str], str]:
    """A collector stand-in in its own process (200 + JSON ack), so its CPU time is not counted as ours."""
    proc = subprocess.Popen([sys.executable, "-c", _SINK], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    port = int(proc.stdout.readline())
    return proc, f"http://127.0.0.1:{port}"


def hook_cost_us(url: str, rounds: int, steps: int = 1500, capture_poll_s: float = 0.0) -> dict[str, float]:
    """Absolute cost of the default level per step, on a trivial step (a 4x4 linear layer, ~100 us).

    Its cost does not depend on the model (one optimizer post-hook and one forward pre-hook on the
    top-level module per step), and a step this short makes it measurable through the noise of a shared
    machine. Each figure is the median over rounds of a per-round difference (hooks on - hooks off), in
    microseconds per step:
      * "wall_us": of the median step's wall time (the figure this bench has always printed);
      * "cpu_us": of the median step's process CPU time;
      * "cpu_mean_us": of the mean step's process CPU time, which also carries what a median leaves out: the
        sender thread's work, done in bursts (one post per 500 events or per second), and the steps that
        read the RSS peak (one per 20 ms).
    The default level here polls for live capture requests every `capture_poll_s` (0: no poll). With a poll,
    "poll_*" keys give the same figures for the poll alone: default level with poll - default level without.
    """
    model = nn.Linear(4, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(2, 4)

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        model(x).sum().backward()
        opt.step()

    diffs: dict[str, list[float]] = collections.defaultdict(list)

    def add(prefix: str, on: list[tuple[float, float]], off: list[tuple[float, float]]) -> None:
        diffs[f"{prefix}wall_us"].append(statistics.median(t[0] for t in on) - statistics.median(t[0] for t in off))
        diffs[f"{prefix}cpu_us"].append(statistics.median(t[1] for t in on) - statistics.median(t[1] for t in off))
        diffs[f"{prefix}cpu_mean_us"].append(statistics.fmean(t[1] for t in on) - statistics.fmean(t[1] for t in off))

    for r in range(rounds):
        blocks = {}
        order = ["off", "default", "nopoll"] if capture_poll_s else ["off", "default"]
        for label in order[r % len(order):] + order[:r % len(order)]:  # rotate
            poll = capture_poll_s if label == "default" else 0.0
            blocks[label] = run_block(step, steps, "off" if label == "off" else "default", url, lambda: None, 50,
                                      capture_poll_s=poll)
        add("", blocks["default"], blocks["off"])
        if capture_poll_s:
            add("poll_", blocks["default"], blocks["nopoll"])
    return {k: statistics.median(v) * 1e6 for k, v in diffs.items()}


def run_block(step: Callable[[], None], n: int, level: str, url: str, sync: Callable[[], None],
              layer_every: int, capture_poll_s: float = 0.0) -> list[tuple[float, float]]:
    """(wall s, process CPU s) per step; process CPU time includes the event-sender and capture-poll threads."""
    prof = None
    if level != "off":
        sender = EventSender(Client(url, "bench"))
        prof = Profiler(job_id="bench", sender=sender, level=level, layer_every=layer_every,
                        capture_poll_s=capture_poll_s)
        prof.install(send_job_start=True, process_hooks=False)
    times = []
    try:
        for _ in range(n):
            t0, c0 = time.perf_counter(), time.process_time()
            step()
            sync()
            times.append((time.perf_counter() - t0, time.process_time() - c0))
    finally:
        if prof is not None:
            prof.close()
    return times[1:]  # the first step of a block includes model discovery (once per job in real use)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--steps", type=int, default=51, help="steps per block (51: one sampled step per 50)")
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads (CPU)")
    ap.add_argument("--models", default="cnn,transformer")
    ap.add_argument("--capture-poll-s", type=float, default=0.05,
                    help="hooks-on blocks poll for live capture requests this often (the real default is 10 s: "
                         "200 times slower; fast here so that any cost of the poll shows; 0 = no poll)")
    args = ap.parse_args(argv)
    torch.manual_seed(0)
    torch.set_num_threads(args.threads)
    device = args.device
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    sink, url = start_sink()
    # (label, level, layer_every): the default level (per-module timing every 100th step), the default level
    # sampling modules every 10th step, and level "layers" (every step: the worst case).
    configs = [("default", "default", 100), ("default/10", "default", 10), ("layers", "layers", 1)]
    factories = {"cnn": make_cnn, "transformer": make_transformer}
    rows = []
    try:
        for name in args.models.split(","):
            _model, step = factories[name](device)
            for _ in range(10):  # warm-up
                step()
            sync()
            blocks: dict[str, list[list[tuple[float, float]]]] = {"off": [], **{c[0]: [] for c in configs}}
            order = [("off", "off", 50), *configs]
            for r in range(args.rounds):
                for label, level, every in order[r % len(order):] + order[:r % len(order)]:  # rotate
                    blocks[label].append(run_block(step, args.steps, level, url, sync, every,
                                                   capture_poll_s=args.capture_poll_s if level != "off" else 0.0))
            for label, _, _ in configs:
                row: list[object] = [name, label]
                for k in (1, 0):  # CPU time first (robust on a shared machine), then wall time
                    off = [[t[k] for t in b] for b in blocks["off"]]
                    on = [[t[k] for t in b] for b in blocks[label]]
                    # paired per round, so that slow drifts of the machine cancel out
                    med = statistics.median(statistics.median(a) / statistics.median(b) for a, b in zip(on, off, strict=True))
                    mean = statistics.median(statistics.fmean(a) / statistics.fmean(b) for a, b in zip(on, off, strict=True))
                    row += [statistics.median(x for b in off for x in b), statistics.median(x for b in on for x in b),
                            100 * (med - 1), 100 * (mean - 1)]
                rows.append(row)
        cost = hook_cost_us(url, rounds=max(3, args.rounds), capture_poll_s=args.capture_poll_s)
    finally:
        sink.terminate()
        sink.wait()
    print(f"device={device} torch={torch.__version__} threads={args.threads} rounds={args.rounds} "
          f"steps/block={args.steps} capture poll every {args.capture_poll_s} s (hooks on)")
    print("step time = process CPU time per step (all threads of the training process, the hooks' sender "
          "included); wall = perf_counter")
    print(f"{'model':<12} {'level':<10} {'median off ms':>13} {'median on ms':>12} {'overhead %':>10} "
          f"{'mean ovh %':>10} | {'wall off ms':>11} {'wall on ms':>10} {'wall ovh %':>10} {'wall mean %':>11}")
    for r in rows:
        name, label, c_off, c_on, c_ovh, c_mean, w_off, w_on, w_ovh, w_mean = r
        print(f"{name:<12} {label:<10} {c_off * 1e3:>13.2f} {c_on * 1e3:>12.2f} {c_ovh:>10.2f} {c_mean:>10.2f} | "
              f"{w_off * 1e3:>11.2f} {w_on * 1e3:>10.2f} {w_ovh:>10.2f} {w_mean:>11.2f}")
    print(f"\ndefault level, absolute cost per step (trivial-step microbenchmark): {cost['wall_us']:.1f} us wall "
          f"(median step); process CPU: {cost['cpu_us']:.1f} us (median step), {cost['cpu_mean_us']:.1f} us (mean step, "
          "the sender thread's bursts included)")
    if args.capture_poll_s:
        print(f"  of which the capture poll (every {args.capture_poll_s} s; default level with poll - without): "
              f"{cost['poll_wall_us']:.1f} us wall (median step); process CPU: {cost['poll_cpu_us']:.1f} us (median "
              f"step), {cost['poll_cpu_mean_us']:.1f} us (mean step, the poll thread included)")
    for r in rows:
        if r[1] == "default":
            print(f"  implied overhead on {r[0]:<12} (median off {r[6] * 1e3:.2f} ms wall): "
                  f"{100 * cost['wall_us'] * 1e-6 / r[6]:.3f} % (wall), "
                  f"{100 * cost['cpu_mean_us'] * 1e-6 / r[6]:.3f} % (mean CPU)")
    write_report(__file__, {
        "device": str(device), "torch_version": torch.__version__, "threads_count": args.threads,
        "rounds_count": args.rounds, "steps_per_block_count": args.steps, "default_cost_per_step_us": cost["wall_us"],
        "default_cpu_cost_per_step_us": cost["cpu_us"], "default_cpu_mean_cost_per_step_us": cost["cpu_mean_us"],
        "capture_poll_s": args.capture_poll_s,
        **{f"capture_{k}": v for k, v in cost.items() if k.startswith("poll_")},
        "rows": {f"{r[0]} {r[1]}": {
            "cpu_off_ms": r[2] * 1e3, "cpu_on_ms": r[3] * 1e3, "cpu_overhead_pct": r[4], "cpu_mean_overhead_pct": r[5],
            "wall_off_ms": r[6] * 1e3, "wall_on_ms": r[7] * 1e3, "wall_overhead_pct": r[8],
            "wall_mean_overhead_pct": r[9]} for r in rows}})
    return 0


if __name__ == "__main__":
    sys.exit(main())
