"""Model factories the estimate tests name as 'tests.estimate.factories:...' (imported in the worker). The
estimate imports only registered factories: the tests register these (tests.estimate.registered)."""

from __future__ import annotations

import time

from torch import nn


def mlp(width: int = 64, depth: int = 2, num_classes: int = 10) -> nn.Module:
    layers: list[nn.Module] = []
    for _ in range(depth):
        layers += [nn.Linear(width, width), nn.ReLU()]
    return nn.Sequential(*layers, nn.Linear(width, num_classes))


def raising() -> nn.Module:
    raise RuntimeError("weights file missing")


def sleeping(seconds: float = 3600.0) -> nn.Module:
    time.sleep(seconds)
    return mlp()


def not_a_module() -> str:
    return "model"


def sandbox_probe(check: str, path: str = "", port: int = 0) -> nn.Module:
    """What the estimate sandbox lets a registered factory do: one `check`, its findings in the error message
    (`PROBE ...`), or a model when the check found nothing to report. Registered by the sandbox tests only."""
    import os
    import socket
    import subprocess

    if check == "env":
        raise RuntimeError(f"PROBE env={dict(os.environ)!r} cwd={os.getcwd()!r}")
    if check == "write":  # path: a file outside the scratch directory, then one inside it
        outcome = []
        for target in (path, os.path.join(os.getcwd(), "inside.txt")):
            try:
                with open(target, "w") as f:
                    f.write("written by an estimate")
                outcome.append("written")
            except OSError as exc:
                outcome.append(f"refused ({type(exc).__name__})")
        raise RuntimeError(f"PROBE outside={outcome[0]} inside={outcome[1]}")
    if check == "spawn":  # path: a marker file the spawned programs would create
        outcome = []
        for attempt in (lambda: subprocess.run(["touch", path], check=True),
                        lambda: os.system(f"touch {path}"), os.fork):
            try:
                pid = attempt()
                if pid == 0:  # the forked child: create the marker and leave at once
                    open(path, "w").close()
                    os._exit(0)
                outcome.append("ran")
            except OSError as exc:
                outcome.append(f"refused ({type(exc).__name__})")
        raise RuntimeError(f"PROBE spawn={outcome}")
    if check == "tcp":
        try:
            socket.create_connection(("127.0.0.1", port), timeout=5).close()
            raise RuntimeError("PROBE tcp=connected")
        except OSError as exc:
            raise RuntimeError(f"PROBE tcp=refused ({type(exc).__name__})") from None
    if check == "dlopen":  # a library the estimate itself wrote (a copy of libc stands in for native code)
        import ctypes
        import ctypes.util
        import shutil

        outcome = []
        for name in ("libc.so.6", shutil.copy("/lib/x86_64-linux-gnu/libc.so.6", "own.so")):
            try:
                ctypes.CDLL(name)
                outcome.append("loaded")
            except OSError as exc:
                outcome.append(f"refused ({type(exc).__name__})")
        raise RuntimeError(f"PROBE installed={outcome[0]} own={outcome[1]}")
    if check == "cpu":
        while True:
            pass
    if check == "memory":
        hog = bytearray(6 * 2**30)  # one 6 GiB buffer
        raise RuntimeError(f"PROBE memory={len(hog) // 2**30} GiB allocated")
    return mlp()
