"""Explain a miss: the traced step and the independent reference side by side, allocation by allocation.

Both sides are sequences of allocations in program order: the tracer's (one per new storage, named by the aten op
and, in forward, the module path) and the profiler's (one per CPU allocator call, named by the innermost aten op
around it). They are aligned on sizes (`difflib`, no junk heuristics); the first block where they differ is where
the estimate's model of the step stops being the step. Per-op totals show what kind of memory is missing or extra.
Only `device: cpu` can be explained on this machine (the reference is a CPU loop).
"""

from __future__ import annotations

import difflib
from collections import defaultdict
from collections.abc import Collection
from dataclasses import dataclass

from server.estimate.models import ResolvedModel
from server.estimate.reference import measure_reference_peak
from server.estimate.schemas import EstimateRequest
from server.estimate.trace_step import StepSettings, trace_step


@dataclass(frozen=True)
class Allocation:
    op: str  # aten op (with module path in forward, on the traced side)
    nbytes: int
    live_bytes: int  # live bytes right after it, baseline included


@dataclass(frozen=True)
class Explanation:
    predicted_peak_bytes: int
    measured_peak_bytes: int
    first_divergence: int | None  # index into both allocation lists where they stop agreeing
    traced: tuple[Allocation, ...]  # the few allocations from the divergence on, traced side
    measured: tuple[Allocation, ...]
    by_op: tuple[tuple[str, int, int], ...]  # (op, traced bytes, measured bytes), largest difference first

    @property
    def error_fraction(self) -> float:
        return (self.predicted_peak_bytes - self.measured_peak_bytes) / self.measured_peak_bytes

    def format(self) -> str:
        mib = 2**20
        lines = [f"predicted peak {self.predicted_peak_bytes / mib:.2f} MiB, "
                 f"measured {self.measured_peak_bytes / mib:.2f} MiB (plain CPU loop, torch.profiler): "
                 f"{100 * self.error_fraction:+.2f} %"]
        if self.first_divergence is None:
            lines.append("allocation sequences agree")
        else:
            lines.append(f"first divergence at allocation #{self.first_divergence} of the measured step:")
            width = max(len(self.traced), len(self.measured))
            for i in range(width):
                t = self.traced[i] if i < len(self.traced) else None
                m = self.measured[i] if i < len(self.measured) else None
                left = f"{t.op[-60:]:>60s} {t.nbytes:>11,d} B" if t else " " * 74
                right = f"{m.op:<34s} {m.nbytes:>11,d} B" if m else ""
                lines.append(f"  traced {left} | measured {right}")
        lines.append("allocated bytes per op, traced vs measured (largest differences):")
        for op, traced, measured in self.by_op[:10]:
            lines.append(f"  {op:<40s} {traced:>13,d} {measured:>13,d} {traced - measured:>+13,d} B")
        return "\n".join(lines)


def _strip(op: str) -> str:
    return op.rsplit("/", 1)[-1].split(".")[0]


def explain(resolved: ResolvedModel, settings: StepSettings, batch_size: int, context: int = 6) -> Explanation:
    st = trace_step(resolved, settings, batch_size, labels=True)
    trace = st.trace
    assert trace.labels is not None
    live = 0
    for _, nbytes in trace.events[: st.marks["step1"][0]]:
        live += nbytes
    traced: list[Allocation] = []
    for (_, nbytes), label in zip(trace.events[st.marks["step1"][0]: st.marks["end"][0]],
                                  trace.labels[st.marks["step1"][0]: st.marks["end"][0]], strict=True):
        live += nbytes
        if nbytes > 0:
            traced.append(Allocation(label, nbytes, live))
    ref = measure_reference_peak(resolved, settings.optimizer, settings.precision, batch_size)
    live = ref.end_bytes - sum(n for _, n, _ in ref.events)
    measured: list[Allocation] = []
    for _, nbytes, op in ref.events:
        live += nbytes
        if nbytes > 0:
            measured.append(Allocation(op, nbytes, live))
    matcher = difflib.SequenceMatcher(None, [a.nbytes for a in traced], [a.nbytes for a in measured],
                                      autojunk=False)
    first = next(((i1, j1) for tag, i1, _, j1, _ in matcher.get_opcodes() if tag != "equal"), None)
    totals: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for a in traced:
        totals[_strip(a.op)][0] += a.nbytes
    for a in measured:
        totals[_strip(a.op)][1] += a.nbytes
    by_op = sorted(((op, t, m) for op, (t, m) in totals.items() if t != m), key=lambda r: -abs(r[1] - r[2]))
    return Explanation(
        predicted_peak_bytes=trace.peak_requested_bytes(), measured_peak_bytes=ref.peak_bytes,
        first_divergence=None if first is None else first[1],
        traced=tuple(traced[first[0]: first[0] + context]) if first else (),
        measured=tuple(measured[first[1]: first[1] + context]) if first else (),
        by_op=tuple(by_op),
    )


def explain_request(request: EstimateRequest, registered: Collection[str] = ()) -> Explanation:
    """`fleetprof estimate --local --explain`: the request's step, traced for device cpu and run for real here."""
    from server.estimate.models import resolve
    from server.estimate.service import step_settings

    resolved = resolve(request.model, request.inputs, request.seq_len, request.target, registered=registered)
    settings = step_settings(request.model_copy(update={"device": "cpu"}))
    return explain(resolved, settings, request.batch_size)


def main() -> None:
    """`python -m server.estimate.explain ZOO_NAME [--batch B] [--precision P] [--optimizer O]`."""
    import argparse
    import warnings

    from server.estimate.zoo.catalogue import ZOO

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("name", choices=[e.name for e in ZOO])
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--precision", default="fp32", choices=["fp32", "amp_bf16"])
    parser.add_argument("--optimizer", default="adamw")
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    entry = next(e for e in ZOO if e.name == args.name)
    settings = StepSettings(optimizer=args.optimizer, precision=args.precision, device="cpu", optimizer_impl="for_loop")
    print(explain(entry.resolve(), settings, args.batch).format())


if __name__ == "__main__":
    main()
