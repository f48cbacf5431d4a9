"""Step-time overhead of the fleetprof PyTorch hooks (issue 4, target: <= 2% at the default level).

Two real models train on random data: a small CNN and a small transformer encoder. In one process, blocks
of steps alternate between no hooks and each hooks level, so that machine noise (a shared CPU) falls on all
configurations alike. Hooks are the real ones (`agent.hooks.torch.Profiler`), shipping real event batches
over HTTP to a local sink that answers like the collector.

    python bench/hook_overhead.py [--device cpu|cuda] [--rounds 8] [--steps 51] [--threads 1]

Prints: model, level, median step time without / with hooks, and the overhead: the median over rounds of
the per-round ratio of medians ("overhead %") and of means ("mean ovh %": it carries the cost of the sampled
per-module step, one in 50 at "layers/50", which the median hides). "layers/1" times every module on every
step: the worst case, not a setting anyone should run with.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
from torch import nn  # noqa: E402

from agent.hooks.sender import EventSender  # noqa: E402
from agent.hooks.torch import Profiler  # noqa: E402
from agent.transport import Transport  # noqa: E402


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


def start_sink() -> tuple[ThreadingHTTPServer, str, list[int]]:
    """Answers event batches the way the collector does (200 + JSON ack); counts events."""
    received = [0]

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            received[0] += 1
            body = json.dumps({"accepted": 1, "server_time": time.time()}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}", received


def run_block(step: Callable[[], None], n: int, level: str, url: str, sync: Callable[[], None],
              layer_every: int) -> list[float]:
    prof = None
    if level != "off":
        sender = EventSender(Transport(url, "bench"))
        prof = Profiler(job_id="bench", sender=sender, level=level, layer_every=layer_every)
        prof.install(send_job_start=True, process_hooks=False)
    times = []
    try:
        for _ in range(n):
            t0 = time.perf_counter()
            step()
            sync()
            times.append(time.perf_counter() - t0)
    finally:
        if prof is not None:
            prof.close()
    return times[1:]  # the first step of a block includes model discovery (once per job in real use)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--steps", type=int, default=51, help="steps per block (51: one sampled step per 50)")
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads (CPU)")
    ap.add_argument("--models", default="cnn,transformer")
    args = ap.parse_args(argv)
    torch.manual_seed(0)
    torch.set_num_threads(args.threads)
    device = args.device
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    server, url, received = start_sink()
    # (label, level, layer_every): "layers" at its default rate, and every step (the worst case).
    configs = [("default", "default", 50), ("layers/50", "layers", 50), ("layers/1", "layers", 1)]
    factories = {"cnn": make_cnn, "transformer": make_transformer}
    rows = []
    for name in args.models.split(","):
        _model, step = factories[name](device)
        for _ in range(10):  # warm-up
            step()
        sync()
        blocks: dict[str, list[list[float]]] = {label: [] for label, _, _ in [("off", "", 0), *configs]}
        order = [("off", "off", 50), *configs]
        for r in range(args.rounds):
            for label, level, every in order[r % len(order):] + order[:r % len(order)]:  # rotate
                blocks[label].append(run_block(step, args.steps, level, url, sync, every))
        off_all = [t for b in blocks["off"] for t in b]
        for label, _, _ in configs:
            on_all = [t for b in blocks[label] for t in b]
            # paired per round, so that slow drifts of a shared machine cancel out
            med_ratio = statistics.median(statistics.median(on) / statistics.median(off)
                                          for on, off in zip(blocks[label], blocks["off"]))
            mean_ratio = statistics.median(statistics.fmean(on) / statistics.fmean(off)
                                           for on, off in zip(blocks[label], blocks["off"]))
            rows.append((name, label, statistics.median(off_all), statistics.median(on_all),
                         100 * (med_ratio - 1), 100 * (mean_ratio - 1)))
    server.shutdown()
    print(f"device={device} torch={torch.__version__} threads={args.threads} rounds={args.rounds} "
          f"steps/block={args.steps} batches received by sink={received[0]}")
    print(f"{'model':<12} {'level':<10} {'median off ms':>13} {'median on ms':>12} {'overhead %':>10} "
          f"{'mean ovh %':>10}")
    for name, label, m_off, m_on, ovh, ovh_mean in rows:
        print(f"{name:<12} {label:<10} {m_off * 1e3:>13.2f} {m_on * 1e3:>12.2f} {ovh:>10.2f} {ovh_mean:>10.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
