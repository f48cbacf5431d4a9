"""The estimate sandbox: what the worker process (server.estimate.runner) may do, both sides of the boundary.

Parent side, `child_environment`: a fresh interpreter gets an environment built from nothing (no database or
broker URL, no token: nothing of the server's own), a scratch directory as cwd, HOME and TMPDIR, and no network
configuration for Hugging Face (offline).

Child side, `lock_down`, before any model code is imported:
- resource limits: CPU time (SIGXCPU, then SIGKILL one second later), address space, file size, no core dumps,
  and no new processes or threads (RLIMIT_NPROC 0; the kernel ignores it for root, which the next two cover);
- Landlock: writes only beneath the scratch directory, no program executed, no TCP connection or listening port,
  no signal to a process outside the sandbox (server.estimate.landlock);
- an audit hook refusing what Python code could still ask for: processes (fork, exec, spawn, subprocess,
  os.system), sockets, ctypes calls and libraries loaded from the scratch directory, raising the limits again,
  and writes outside the scratch directory (the fallback where the kernel has no Landlock).
Trusted imports (torch, the estimator, transformers for a Hugging Face request) happen before the lock-down,
under the CPU and memory limits only.
"""

from __future__ import annotations

import logging
import os
import resource
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from server.estimate import landlock

logger = logging.getLogger(__name__)

GIB = 2**30


@dataclass(frozen=True)
class SandboxLimits:
    cpu_s: int = 120                 # CPU seconds (user + system) of the worker
    memory_bytes: int = 8 * GIB      # address space (RLIMIT_AS): the meta-device trace allocates no tensors
    file_bytes: int = 1 * GIB        # largest file it may write (in its scratch directory)

    def describe(self) -> str:
        return f"{self.cpu_s} s of CPU time, {self.memory_bytes / GIB:g} GiB of address space"


def child_environment(scratch: Path, python_path: list[str]) -> dict[str, str]:
    """The whole environment of the worker: nothing inherited from the server."""
    return {
        "PYTHONPATH": os.pathsep.join(python_path),
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONNOUSERSITE": "1",
        "HOME": str(scratch), "TMPDIR": str(scratch), "XDG_CACHE_HOME": str(scratch / ".cache"),
        "HF_HOME": str(scratch / "hf"), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
        "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",  # the meta trace does no arithmetic
        "LANG": "C.UTF-8",
    }


def import_path(repo_root: Path) -> list[str]:
    """The worker's PYTHONPATH: this repository, then the server's own additions to sys.path (registered
    factories installed beside the server); the interpreter's own directories it finds by itself, and the
    server's script directory (sys.path[0]) is not passed on."""
    own = tuple({sys.prefix, sys.base_prefix, sys.exec_prefix})
    extra = [p for p in sys.path[1:] if p and not p.startswith(own) and os.path.isdir(p)]
    return list(dict.fromkeys([str(repo_root), *extra]))


def set_limits(limits: SandboxLimits) -> None:
    resource.setrlimit(resource.RLIMIT_CPU, (limits.cpu_s, limits.cpu_s + 1))
    resource.setrlimit(resource.RLIMIT_AS, (limits.memory_bytes, limits.memory_bytes))
    resource.setrlimit(resource.RLIMIT_FSIZE, (limits.file_bytes, limits.file_bytes))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


# audit events (https://docs.python.org/3/library/audit_events.html) refused once locked down
_REFUSED_EVENTS = frozenset({
    "os.fork", "os.forkpty", "os.exec", "os.posix_spawn", "os.spawn", "os.system", "os.startfile", "subprocess.Popen",
    "pty.spawn", "os.kill", "os.killpg", "signal.pthread_kill", "socket.__new__", "socket.connect", "socket.bind",
    "ctypes.dlsym", "ctypes.call_function", "ctypes.cdata", "resource.setrlimit", "resource.prlimit",
    "sys.remote_exec",
})
# events that change the file system -> the positions of the paths they change (open is checked by its mode)
_WRITE_EVENTS: dict[str, tuple[int, ...]] = {
    **dict.fromkeys(("os.remove", "os.rmdir", "os.mkdir", "os.truncate", "os.chmod", "os.chown", "os.utime",
                     "os.mkfifo", "os.mknod", "shutil.rmtree"), (0,)),
    **dict.fromkeys(("os.rename", "shutil.move"), (0, 1)),
    **dict.fromkeys(("os.symlink", "os.link", "shutil.copyfile", "shutil.copytree"), (1,)),
}
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND


class _Guard:
    """sys.addaudithook callback: refuse process, network and ctypes events, and writes outside `scratch`."""

    def __init__(self, scratch: Path) -> None:
        self.scratch = os.path.realpath(scratch)

    def _inside(self, path: Any) -> bool:
        if isinstance(path, int):  # an open descriptor: already checked when it was opened
            return True
        try:
            real = os.path.realpath(os.fsdecode(path))
        except (TypeError, ValueError):
            return False
        return real == self.scratch or real.startswith(self.scratch + os.sep)

    def __call__(self, event: str, args: tuple[Any, ...]) -> None:
        if event in _REFUSED_EVENTS:
            raise PermissionError(f"estimate sandbox: {event} is not allowed")
        # Loading an installed library is allowed (torch.distributed's import opens libc; calling into it through
        # ctypes is not): a path inside the scratch directory is the one place new native code could come from.
        if event == "ctypes.dlopen" and args and isinstance(args[0], str) and "/" in args[0] and self._inside(args[0]):
            raise PermissionError("estimate sandbox: loading a library from the scratch directory is not allowed")
        if event == "open" and len(args) >= 3:
            path, mode, flags = args[0], args[1], args[2]
            writes = (isinstance(mode, str) and any(c in mode for c in "wax+")) or (
                isinstance(flags, int) and flags & _WRITE_FLAGS)
            if writes and path is not None and not self._inside(path):
                raise PermissionError(f"estimate sandbox: writing {path!r} is not allowed (only the scratch directory)")
        elif event in _WRITE_EVENTS and not all(
                self._inside(args[i]) for i in _WRITE_EVENTS[event] if i < len(args) and args[i] is not None):
            raise PermissionError(f"estimate sandbox: {event} outside the scratch directory is not allowed")


def lock_down(scratch: Path) -> list[str]:
    """Irreversible: Landlock, no new processes, the audit hook. Returns what was applied, for the log."""
    applied = []
    try:
        applied.append(f"landlock ABI {landlock.restrict([scratch])}")
    except OSError as exc:  # no Landlock in this kernel: the audit hook still refuses writes outside scratch
        logger.warning("estimate sandbox without Landlock (%s): writes are refused by the audit hook only", exc)
    resource.setrlimit(resource.RLIMIT_NPROC, (0, 0))
    applied.append("RLIMIT_NPROC 0" + (" (ignored for root)" if os.geteuid() == 0 else ""))
    sys.addaudithook(_Guard(scratch))
    applied.append("audit hook")
    return applied
