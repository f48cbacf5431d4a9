"""TensorFlow profiler traces (the trace viewer's JSON) read by the Kineto summarizer.

TensorBoard's profile plugin (xprof) turns a profile (`plugins/profile/<run>/<host>.xplane.pb`, written by
`tf.profiler.experimental.start/stop` or `keras.callbacks.TensorBoard(profile_batch=...)`) into Chrome trace-event
JSON: the `<host>.trace.json.gz` TensorFlow used to write beside it, and what the trace viewer downloads. Its
conventions differ from Kineto's, and this module maps them onto what `kineto._Accumulator` reads:
  * Detection: a `process_name` metadata event named like an XPlane plane, `/host:CPU` or `/device:GPU:0`
    (Kineto names its processes after the host process or the GPU, never with that prefix). TF writes them first.
  * Steps: TF's profiler groups the events of one step under an `args.group_id` (its step tracker: one group per
    call of the step function). A step's time is the span of its group's events, host and device; groups are
    numbered from 0 in the order the profile met them (the trace does not carry the training step's own number).
  * Host events (the `/host:` planes) are CPU ops (`cat` "cpu_op"); on a `/device:GPU:N` plane only the
    `Stream #...` threads hold GPU activities (`stream` = the thread, `device` = N); the plane's other lines
    ("TensorFlow Ops", "XLA Ops", "Steps", name scopes) restate the same time at a coarser grain and are skipped.
  * Per-layer time: a TF op's `args.long_name` is its graph path, `[StatefulPartitionedCall/][gradient_tape/]
    <model>/<layer>/.../<op>:<type>`: an op's time goes to its model/layer scope, forward or (under
    `gradient_tape/`) backward. Scope names are TF's, uniquified in the graph (Keras's `conv` may read `conv_1`).
The GPU-plane mapping follows the trace viewer's documented layout; the traces checked in (tests/data/tf-profiler)
are CPU profiles.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

PLANE_PREFIXES = ("/host:", "/device:")
_GPU_PREFIX = "/device:GPU:"
_CALL_PREFIXES = ("StatefulPartitionedCall/", "PartitionedCall/")
_BACKWARD_SCOPE = "gradient_tape/"
TOP_SCOPES = 50


@dataclass(frozen=True)
class ScopeTime:
    """One model/layer scope's op time over the profiled steps (µs, trace clock)."""

    scope: str
    forward_us: float
    backward_us: float
    ops: int


def is_tf_plane(name: Any) -> bool:
    return isinstance(name, str) and name.startswith(PLANE_PREFIXES)


def layer_scope(long_name: str) -> tuple[str, bool] | None:
    """('model/layer', backward?) of a TF op's graph path, or None for an op outside any layer scope."""
    path = long_name.split(":", 1)[0]
    for prefix in _CALL_PREFIXES:
        if path.startswith(prefix):
            path = path[len(prefix):]
            break
    backward = path.startswith(_BACKWARD_SCOPE)
    if backward:
        path = path[len(_BACKWARD_SCOPE):]
    parts = path.split("/")
    if len(parts) < 3:  # model/layer/op at least
        return None
    if parts[1][:1].isupper():  # an op under a scope that holds no layer (TF ops are CamelCase: `adam/Sub_3/...`)
        return parts[0], backward
    return f"{parts[0]}/{parts[1]}", backward


class TfTraceReader:
    """Watches a trace's metadata; once it is a TF trace, rewrites each event into Kineto's shape (or drops it)."""

    def __init__(self) -> None:
        self.active = False
        self._host_pids: set[Any] = set()
        self._gpu_pids: dict[Any, int] = {}
        self._streams: set[tuple[Any, Any]] = set()
        self._groups: dict[int, list[float]] = {}  # group_id -> [start, end]
        self._scopes: dict[str, list[float]] = {}  # scope -> [forward, backward, ops]

    def note_metadata(self, ev: dict[str, Any]) -> None:
        args = ev.get("args")
        name = args.get("name") if isinstance(args, dict) else None
        if ev.get("name") == "process_name" and is_tf_plane(name):
            self.active = True
            assert isinstance(name, str)
            if name.startswith(_GPU_PREFIX):
                try:
                    self._gpu_pids[ev.get("pid")] = int(name[len(_GPU_PREFIX):])
                except ValueError:
                    self._gpu_pids[ev.get("pid")] = 0
            elif name.startswith("/host:"):
                self._host_pids.add(ev.get("pid"))
        elif ev.get("name") == "thread_name" and isinstance(name, str) and name.startswith("Stream"):
            self._streams.add((ev.get("pid"), ev.get("tid")))

    def normalize(self, ev: dict[str, Any]) -> dict[str, Any] | None:
        ts, dur = ev.get("ts"), ev.get("dur")
        if ev.get("ph") != "X" or not isinstance(ts, (int, float)) or not isinstance(dur, (int, float)):
            return None
        args = ev.get("args")
        args = args if isinstance(args, dict) else {}
        group = args.get("group_id")
        if group is not None:
            try:
                gid = int(group)
            except (TypeError, ValueError):
                gid = -1
            if gid >= 0:
                span = self._groups.get(gid)
                end = float(ts) + float(dur)
                if span is None:
                    self._groups[gid] = [float(ts), end]
                else:
                    span[0] = min(span[0], float(ts))
                    span[1] = max(span[1], end)
        pid = ev.get("pid")
        if pid in self._gpu_pids:
            if (pid, ev.get("tid")) not in self._streams:
                return None
            stream = ev.get("tid") if isinstance(ev.get("tid"), int) else 0
            return {"name": ev.get("name"), "ph": "X", "ts": ts, "dur": dur, "cat": "kernel",
                    "args": {"stream": stream, "device": self._gpu_pids[pid]}}
        long_name = args.get("long_name")
        if isinstance(long_name, str):
            found = layer_scope(long_name)
            if found is not None:
                acc = self._scopes.setdefault(found[0], [0.0, 0.0, 0.0])
                acc[1 if found[1] else 0] += float(dur)
                acc[2] += 1
        return {"name": ev.get("name"), "ph": "X", "ts": ts, "dur": dur, "cat": "cpu_op", "args": {}}

    def steps(self) -> dict[int, tuple[float, float]]:
        """group_id -> (start µs, duration µs), renumbered from 0 in time order."""
        spans = sorted(self._groups.values())
        return {i: (s, e - s) for i, (s, e) in enumerate(spans)}

    def scopes(self) -> list[ScopeTime]:
        """The TOP_SCOPES scopes with the most op time."""
        rows = [ScopeTime(scope=k, forward_us=v[0], backward_us=v[1], ops=int(v[2])) for k, v in self._scopes.items()]
        return sorted(rows, key=lambda r: -(r.forward_us + r.backward_us))[:TOP_SCOPES]
