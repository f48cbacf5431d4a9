"""The work behind `fleetprof.profile()` (fleetprof/profiling.py): register the block as a job, install the framework
hooks for it, and, in local mode, run a collector and an NVML sampler in this process and write the report.

The hooks are those `fleetprof run` installs, for each framework the process imports (none is imported here): at
the block's start for those already imported, else right after the program imports one inside the block
(`embedded.import_watch`): PyTorch (`agent.hooks.torch`), Keras 3 on any backend (`agent.hooks.keras`: its
`Model.fit` calls count; on the torch backend the PyTorch hooks stand down inside `fit`, as under `fleetprof run`)
and JAX (`agent.hooks.jax`: its `@train_step` functions and `fleetprof_step` marks count).

A composition root (it composes the agent's hooks and sampler with the server), hence here and not in `fleetprof`
or `agent`. Nothing in it may break the user's block: a failure to profile is logged and the block runs unprofiled;
the block's own exception always goes on to the caller.
"""

from __future__ import annotations

import getpass
import json
import logging
import os
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Any

from agent.config import load_settings, node_name
from agent.run import generate_job_id, gpus_from_cuda_visible_devices
from embedded.import_watch import ImportWatcher
from fleetprof.client import ApiError, Client
from fleetprof.jobid import report_filename
from fleetprof.profiling import ProfileOptions, ProfileResult

log = logging.getLogger("fleetprof.profile")

FLUSH_TIMEOUT_S = 30.0  # local mode waits for every event before characterizing; server mode as long at most


def open_block(options: ProfileOptions) -> Block:
    return Block(options)


def report_folder(options: ProfileOptions) -> Path:
    """Where local mode writes: `output_dir`, else the folder of the script being run (`__main__`), else the
    working directory (an interactive session, `python -c`)."""
    if options.output_dir is not None:
        return options.output_dir
    main_file = getattr(sys.modules.get("__main__"), "__file__", None)
    return Path(main_file).resolve().parent if main_file else Path.cwd()


def _script_name() -> str | None:
    main_file = getattr(sys.modules.get("__main__"), "__file__", None)
    return os.path.basename(main_file) if main_file else None


def _user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return "user"


HOOKED = ("jax", "keras", "torch")  # each with a sender of its own: the order changes nothing they send


def _hooked_frameworks(options: ProfileOptions) -> list[str]:
    """The frameworks whose hooks the block gets: those the process has imported (a program that has imported
    none is not made to: NVML-level profiling only)."""
    return [name for name in HOOKED if options.hooks and name in sys.modules]


def _job_framework(frameworks: list[str]) -> str | None:
    """The job's framework as the hooks name it: Keras (which imports torch or jax as its backend) first."""
    if "keras" in frameworks:
        keras = sys.modules["keras"]
        try:
            return f"keras {keras.__version__} ({keras.backend.backend()} backend)"
        except Exception:  # noqa: BLE001 - a keras that cannot tell: its hooks' job_start will
            return None
    if "torch" in frameworks:
        return "pytorch"
    return f"jax {getattr(sys.modules['jax'], '__version__', '')}".strip() if "jax" in frameworks else None


def _visible_gpu_uuids() -> list[str]:
    """UUIDs of the GPUs this process may use, by NVML (CUDA_VISIBLE_DEVICES respected); [] without NVML."""
    named = gpus_from_cuda_visible_devices(os.environ.get("CUDA_VISIBLE_DEVICES"))
    if named is not None:
        return named
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:  # noqa: BLE001 - no driver, no library, no GPU: a CPU-only block
        return []
    try:
        uuids = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            uuid = pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetHandleByIndex(i))
            uuids.append(uuid.decode() if isinstance(uuid, bytes) else str(uuid))
    except Exception:  # noqa: BLE001
        return []
    finally:
        pynvml.nvmlShutdown()
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:  # indices (UUIDs were handled above)
        try:
            picked = [int(v) for v in visible.split(",") if v.strip()]
        except ValueError:
            return uuids
        uuids = [uuids[i] for i in picked if 0 <= i < len(uuids)]
    return uuids


class Block:
    """One profiled block, from `__enter__` (the constructor) to `finish`."""

    def __init__(self, options: ProfileOptions, *, nvml_source: str = "nvml", gpu_uuids: list[str] | None = None):
        """`nvml_source` and `gpu_uuids` stand in for this machine's NVML in tests (the agent's `fake:N` test double,
        whose batches say so: source "test")."""
        self.options = options
        self.settings = load_settings(server_url=options.server_url, token=options.token, hooks_level=options.level)
        self.local = options.local if options.local is not None else not self.settings.server_url
        self.job_id = options.job_id or generate_job_id(_user())
        self.started_at = time.time()
        self._collector: Any = None
        self._agent: tuple[threading.Thread, threading.Event] | None = None
        self._profs: list[tuple[str, Any]] = []  # (framework, its block profiler), in installation order
        self._profs_lock = threading.Lock()
        self._watcher: ImportWatcher | None = None
        self._registered = False
        self._job: dict[str, Any] = {}
        try:
            self._start(nvml_source, gpu_uuids)
        except Exception as exc:  # profiling must never stop the user's block
            log.warning("fleetprof.profile: the block runs unprofiled: %s", exc)
            self._stop_services()

    # ------------------------------------------------------------------ start

    def _start(self, nvml_source: str, gpus: list[str] | None) -> None:
        if self.local:
            from embedded.local_collector import LocalCollector

            self._collector = LocalCollector()
            self.transport = Client(self._collector.url, self._collector.token, timeout_s=30.0)
        else:
            if not self.settings.server_url:
                raise ValueError("server mode without a server: set FLEETPROF_SERVER_URL or pass server_url=")
            self.transport = Client(self.settings.server_url, self.settings.token, timeout_s=5.0)
        gpu_uuids = gpus if gpus is not None else _visible_gpu_uuids() if self.local else \
            gpus_from_cuda_visible_devices(os.environ.get("CUDA_VISIBLE_DEVICES"))
        frameworks = _hooked_frameworks(self.options)
        metadata = {**self.options.metadata, "profiled_by": "fleetprof.profile"}
        if self.options.batch_size is not None:
            metadata["batch_size_source"] = "flag"
        self._job = {
            "job_id": self.job_id, "team": self.options.team, "name": self.options.name or _script_name(),
            "command": " ".join(sys.argv) or None, "host": socket.gethostname(), "user": _user(),
            "state": "running", "started_at": self.started_at, "framework": _job_framework(frameworks),
            "batch_size": self.options.batch_size, "metadata": metadata,
            # local mode: this machine's GPUs are the block's (the operator token registers them as said)
            "gpu_uuids": gpu_uuids or None, "node": node_name(self.settings) if self.local and gpu_uuids else None,
        }
        try:
            self.transport.register_job({k: v for k, v in self._job.items() if v is not None})
            self._registered = True
        except ApiError as exc:
            log.warning("fleetprof.profile: job %s not registered (%s); its events may be refused", self.job_id, exc)
        if self.local and gpu_uuids:
            self._start_sampler(nvml_source)
        for name in frameworks:
            self._hook(name)
        if self.options.hooks and self.settings.hooks_level != "off":
            self._watcher = ImportWatcher([n for n in HOOKED if n not in sys.modules], self._hook).start()

    def _hook(self, name: str) -> None:
        """Install `name`'s block hooks (at the start, or when the block imports it)."""
        try:
            prof = self._install_hooks(name)
        except Exception as exc:  # noqa: BLE001 - one framework's hooks failing leaves the others'
            log.warning("fleetprof.profile: no %s hooks for the block: %s", name, exc)
            return
        if prof is not None:
            with self._profs_lock:
                self._profs.append((name, prof))

    def _install_hooks(self, framework: str) -> Any:
        if framework == "torch":
            from agent.hooks.torch import install_block

            return install_block(self.job_id, self.transport, self.settings)
        if framework == "keras":
            from agent.hooks import keras as keras_hooks

            return keras_hooks.install_block(sys.modules["keras"], self.job_id, self.transport, self.settings)
        from agent.hooks import jax as jax_hooks

        return jax_hooks.install_block(sys.modules["jax"], self.job_id, self.transport, self.settings)

    def _uninstall_hooks(self, exc: BaseException | None) -> None:
        """Each framework's hooks ended (flushed), the last installed first; one that fails leaves the others'."""
        while self._profs:
            name, prof = self._profs.pop()
            try:
                if name == "torch":
                    from agent.hooks.torch import uninstall

                    uninstall(prof, exc=exc, timeout_s=FLUSH_TIMEOUT_S)
                elif name == "keras":
                    from agent.hooks import keras as keras_hooks

                    keras_hooks.uninstall(prof, timeout_s=FLUSH_TIMEOUT_S)
                else:
                    from agent.hooks import jax as jax_hooks

                    jax_hooks.uninstall(prof, timeout_s=FLUSH_TIMEOUT_S)
            except Exception as exc2:  # noqa: BLE001 - the other frameworks' events still go
                log.warning("fleetprof.profile: the %s hooks did not end cleanly: %s", name, exc2)

    def _start_sampler(self, source: str) -> None:
        """The node agent's sampler for this machine's GPUs, into the local collector (agent token, any node)."""
        from agent.daemon import run_agent
        from server.auth.service import create_token
        from server.db import make_engine, make_sessionmaker, session_scope

        engine = make_engine(self._collector.settings)
        try:
            with session_scope(make_sessionmaker(engine)) as session:
                token = create_token(session, scope="agent", node="*", description="fleetprof.profile sampler")
        finally:
            engine.dispose()
        agent_settings = load_settings(server_url=self._collector.url, token=token,
                                       spool_dir=self._collector.data_dir / "spool", batch_interval_s=1.0,
                                       node_name=node_name(self.settings))
        stop = threading.Event()

        def sample() -> None:
            try:
                run_agent(agent_settings, source=source, stop=stop)
            except Exception as exc:  # noqa: BLE001 - no NVML after all: the hooks' figures alone
                log.warning("fleetprof.profile: no NVML sampling: %s", exc)

        thread = threading.Thread(target=sample, name="fleetprof-profile-nvml", daemon=True)
        thread.start()
        self._agent = (thread, stop)

    # ------------------------------------------------------------------ finish

    def finish(self, exc: BaseException | None) -> ProfileResult:
        state = "finished" if exc is None else "oom" if _is_oom(exc) else "failed"
        json_path = html_path = None
        report: dict[str, Any] | None = None
        html: str | None = None
        runs: dict[str, str] = {}
        if self._watcher is not None:
            self._watcher.close()
        with self._profs_lock:
            hooked: tuple[str, ...] = tuple(sorted(name for name, _ in self._profs))
        if self._job.get("framework") is None:  # a framework imported inside the block: named at the end
            self._job["framework"] = _job_framework(list(hooked))
        try:
            self._uninstall_hooks(exc)
            if self._agent is not None:
                thread, stop = self._agent
                stop.set()
                thread.join(timeout=FLUSH_TIMEOUT_S)
            if self._registered:
                self.transport.register_job({k: v for k, v in {**self._job, "state": state, "ended_at": time.time(),
                                                               "exit_code": None if exc is None else 1}.items()
                                             if v is not None})
            if self.local and self._collector is not None:
                report = self.transport.report_json(self.job_id, refresh=True)
                html = self.transport.report_html(self.job_id)
                folder = report_folder(self.options)
                folder.mkdir(parents=True, exist_ok=True)
                written_json = folder / report_filename(self.job_id, "json")
                written_html = folder / report_filename(self.job_id, "html")
                written_json.write_text(json.dumps(report, indent=1) + "\n")
                written_html.write_text(html)
                json_path, html_path = written_json, written_html  # the result names only files that exist
                log.info("fleetprof.profile: report of job %s written to %s and %s", self.job_id, json_path,
                         html_path.name)
            if self.options.log_to and self._registered:
                if report is None:  # server mode: the report as the server has it now
                    report = self.transport.report_json(self.job_id, refresh=True)
                    html = self.transport.report_html(self.job_id)
                runs = _log_to_trackers(report, html, self.options.log_to)
        except Exception as exc2:  # noqa: BLE001 - the block's outcome is the caller's; ours is a warning
            log.warning("fleetprof.profile: could not complete the report of job %s: %s", self.job_id, exc2)
        finally:
            self._stop_services()
        return ProfileResult(job_id=self.job_id, mode="local" if self.local else "server", state=state,
                             server_url=None if self.local else self.settings.server_url,
                             report_json_path=json_path, report_html_path=html_path, report=report,
                             hooks=bool(hooked), hooked=hooked, tracker_runs=runs)

    def _stop_services(self) -> None:
        if self._watcher is not None:
            self._watcher.close()
        transport = getattr(self, "transport", None)
        if transport is not None:
            transport.close()
        if self._collector is not None:
            self._collector.close()
            self._collector = None


def _log_to_trackers(report: dict[str, Any], html: str | None, trackers: tuple[str, ...]) -> dict[str, str]:
    """Each tracker its own chance: one that fails (not installed, unreachable) is a warning, not the others' loss."""
    from fleetprof.trackers import log_report

    runs = {}
    for tracker in dict.fromkeys(trackers):
        try:
            runs[tracker] = log_report(report, html, to=tracker)
        except Exception as exc:  # noqa: BLE001
            log.warning("fleetprof.profile: not logged to %s: %s", tracker, exc)
    return runs


def _is_oom(exc: BaseException) -> bool:
    torch = sys.modules.get("torch")
    oom = getattr(torch, "OutOfMemoryError", None) if torch is not None else None
    return oom is not None and isinstance(exc, oom)
