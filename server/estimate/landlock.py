"""Linux Landlock (unprivileged, no seccomp) for the estimate sandbox: once `restrict` returns, this process and
anything it starts can write only beneath the given directories, execute no program, and (kernel ABI >= 4) open
no TCP connection or listening port, nor (ABI >= 6) signal processes outside the sandbox. Reading stays allowed.
The restriction cannot be lifted by the process, root included.

Raw syscalls through ctypes (x86_64 and aarch64 numbers are the same since Linux 5.13); see
Documentation/userspace-api/landlock.rst for the structures.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Iterable
from pathlib import Path

_SYS_CREATE_RULESET, _SYS_ADD_RULE, _SYS_RESTRICT_SELF = 444, 445, 446
_CREATE_RULESET_VERSION = 1
_RULE_PATH_BENEATH = 1
_PR_SET_NO_NEW_PRIVS = 38

_EXECUTE = 1 << 0
_WRITE_FILE = 1 << 1  # (bits 2 and 3, read file and read dir, are not handled: reading stays allowed)
# remove dir/file, make char/dir/reg/sock/fifo/block/sym (ABI 1), refer (ABI 2), truncate (ABI 3)
_WRITES_V1 = _WRITE_FILE | sum(1 << bit for bit in range(4, 13))
_REFER, _TRUNCATE = 1 << 13, 1 << 14
_NET_BIND_TCP, _NET_CONNECT_TCP = 1 << 0, 1 << 1
_SCOPE_ABSTRACT_UNIX_SOCKET, _SCOPE_SIGNAL = 1 << 0, 1 << 1


class LandlockUnavailable(OSError):
    """The kernel has no Landlock (older than 5.13, or disabled at boot)."""


class _RulesetAttr(ctypes.Structure):
    _fields_ = [("handled_access_fs", ctypes.c_uint64), ("handled_access_net", ctypes.c_uint64),
                ("scoped", ctypes.c_uint64)]


class _PathBeneathAttr(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


def _libc() -> ctypes.CDLL:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    return libc


def abi_version() -> int:
    """The kernel's Landlock ABI (0 when there is none)."""
    rc = _libc().syscall(_SYS_CREATE_RULESET, None, ctypes.c_size_t(0), ctypes.c_uint32(_CREATE_RULESET_VERSION))
    return max(int(rc), 0)


def _check(rc: int, what: str) -> int:
    if rc < 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"landlock {what}: {os.strerror(errno)}")
    return rc


def restrict(writable: Iterable[Path]) -> int:
    """Confine this process: writes only beneath `writable`, no execve, no TCP, no signals out. Returns the ABI
    used; LandlockUnavailable when the kernel has none."""
    abi = abi_version()
    if abi < 1:
        raise LandlockUnavailable("this kernel has no Landlock")
    writes = _WRITES_V1 | (_REFER if abi >= 2 else 0) | (_TRUNCATE if abi >= 3 else 0)
    attr = _RulesetAttr(handled_access_fs=writes | _EXECUTE)
    size = 8  # ABI 1-3: the fs field only
    if abi >= 4:
        attr.handled_access_net, size = _NET_BIND_TCP | _NET_CONNECT_TCP, 16
    if abi >= 6:
        attr.scoped, size = _SCOPE_ABSTRACT_UNIX_SOCKET | _SCOPE_SIGNAL, 24
    libc = _libc()
    ruleset = _check(libc.syscall(_SYS_CREATE_RULESET, ctypes.byref(attr), ctypes.c_size_t(size),
                                  ctypes.c_uint32(0)), "create_ruleset")
    try:
        for path in writable:
            fd = os.open(path, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
            try:
                # REFER may be granted only where it is handled; directories take every write right
                rule = _PathBeneathAttr(allowed_access=writes, parent_fd=fd)
                _check(libc.syscall(_SYS_ADD_RULE, ctypes.c_int(ruleset), ctypes.c_int(_RULE_PATH_BENEATH),
                                    ctypes.byref(rule), ctypes.c_uint32(0)), f"add_rule {path}")
            finally:
                os.close(fd)
        _check(libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl(NO_NEW_PRIVS)")
        _check(libc.syscall(_SYS_RESTRICT_SELF, ctypes.c_int(ruleset), ctypes.c_uint32(0)), "restrict_self")
    finally:
        os.close(ruleset)
    return abi
