"""`fleetprof.profile()`: profile a block of code, or a function, from inside the program (issue #22).

    import fleetprof

    with fleetprof.profile(job_id="resnet-bs64", team="vision"):
        train()

    @fleetprof.profile(name="finetune")
    def main(): ...

The block gets the hooks `fleetprof run` installs (steps, step time, per-module timing, allocator peaks, the model's
fingerprint) for the frameworks the program has imported when the block starts: PyTorch, Keras 3 (`Model.fit`, any
backend) and JAX (`@train_step` functions), and is registered as a job. Where it goes:
- **server mode** (FLEETPROF_SERVER_URL set, or `server_url=`): events go to that collector, as under `fleetprof run`;
  the report is the server's (`fleetprof report JOB_ID`).
- **local mode** (no server configured, or `local=True`): a collector runs inside this process for the block (SQLite in
  a temporary folder, the embedded mode of `fleetprof up`), samples this machine's GPUs through NVML where there are
  some, and at the end writes the report as `fleetprof-<job id>.json` and `.html` next to the script (the folder of
  `__main__`, else the working directory; `output_dir=` chooses), in the manner of CodeCarbon and Zeus.
`log_to=("mlflow", "wandb")` also logs the report's headline figures to those trackers (the active MLflow run or W&B
run when there is one; fleetprof/trackers.py).

This module is the bare install's entry point: it holds the options and the result and imports nothing of the
agent or the server. The work is done by `embedded.profile`, found by module name when a block starts (as
`fleetprof.cli` dispatches its subcommands), because local mode composes the agent's hooks with the server.
"""

from __future__ import annotations

import contextlib
import importlib
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import TracebackType
from typing import Any, Protocol

BACKEND = "embedded.profile"  # the module that runs a block: open_block(ProfileOptions) -> RunningBlock


@dataclass(frozen=True)
class ProfileOptions:
    """What `fleetprof.profile()` was given. None = the environment's setting (FLEETPROF_*) or the default."""

    job_id: str | None = None  # None: `<user>-<UTC time>-<4 hex>`, a new one per block
    team: str | None = None
    name: str | None = None  # None: the script's file name
    batch_size: int | None = None  # overrides what the hooks read from the DataLoader / the model's inputs
    server_url: str | None = None
    token: str | None = None
    local: bool | None = None  # None: local exactly when no server is configured
    output_dir: Path | None = None  # local mode's report folder; None: next to the script
    level: str | None = None  # hooks level: off | default | layers (FLEETPROF_HOOKS_LEVEL)
    hooks: bool = True  # False: NVML only (the framework hooks stay off even where torch/keras/jax is imported)
    metadata: dict[str, Any] = field(default_factory=dict)  # stored with the job
    log_to: tuple[str, ...] = ()  # trackers the report's headline figures go to at the end (fleetprof.trackers)


@dataclass(frozen=True)
class ProfileResult:
    """What a finished block left behind. Paths are None in server mode (the report lives on the server)."""

    job_id: str
    mode: str  # "local" | "server"
    state: str  # finished | failed | oom
    server_url: str | None  # server mode: where the report is
    report_json_path: Path | None
    report_html_path: Path | None
    report: dict[str, Any] | None  # local mode: the report document (PRODUCT.md keys)
    hooks: bool  # whether framework hooks ran for the block
    tracker_runs: dict[str, str] = field(default_factory=dict)  # tracker -> the run the report was logged to
    hooked: tuple[str, ...] = ()  # the frameworks whose hooks ran for the block: "jax", "keras", "torch"


class RunningBlock(Protocol):
    job_id: str

    def finish(self, exc: BaseException | None) -> ProfileResult: ...


class profile(contextlib.ContextDecorator):  # noqa: N801 - used like a function, as contextlib's own are
    """Context manager and decorator; `result` holds the last block's `ProfileResult` once it has ended.

    A decorated function called several times is profiled once per call: each call is a job of its own (a new
    generated id, or the same `job_id` re-registered when one was given).
    """

    def __init__(self, job_id: str | None = None, *, team: str | None = None, name: str | None = None,
                 batch_size: int | None = None, server_url: str | None = None, token: str | None = None,
                 local: bool | None = None, output_dir: str | Path | None = None, level: str | None = None,
                 hooks: bool = True, metadata: dict[str, Any] | None = None, log_to: str | tuple[str, ...] = ()):
        self.options = ProfileOptions(job_id=job_id, team=team, name=name, batch_size=batch_size,
                                      server_url=server_url, token=token, local=local,
                                      output_dir=Path(output_dir) if output_dir is not None else None,
                                      level=level, hooks=hooks, metadata=dict(metadata or {}),
                                      log_to=(log_to,) if isinstance(log_to, str) else tuple(log_to))
        self.result: ProfileResult | None = None
        self._running: list[RunningBlock] = []

    @property
    def job_id(self) -> str | None:
        """The running block's job id (the innermost one), else the last finished one's."""
        if self._running:
            return self._running[-1].job_id
        return self.result.job_id if self.result is not None else self.options.job_id

    def _recreate_cm(self) -> profile:
        # ContextDecorator calls this for each call of a decorated function: one block per call
        return self

    def __enter__(self) -> profile:
        backend = importlib.import_module(BACKEND)
        self._running.append(backend.open_block(replace(self.options)))
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        block = self._running.pop()
        self.result = block.finish(exc)
