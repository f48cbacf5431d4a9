"""Durable on-disk spool of protocol batches between the sampler and the shipper.

Layout of the spool directory:
- `000000000001.jsonl`, `000000000002.jsonl`, ...: append-only segments, one SampleBatch JSON per line (the
  fleetprof recording format, so a spool copied off a node can be replayed as is);
- `ack`: "<segment> <offset>", everything before that position has been acknowledged by the collector;
- `lock`: flock'ed while an agent owns the spool.

Crash safety: a line is written in one `write` and fsync'ed before `append` returns, so a batch the sampler
was told is spooled survives `kill -9` and power loss. A torn last line (killed mid-write) has no newline or
is not valid JSON: it is found when the spool is opened, logged and cut off. The ack file is replaced
atomically (rename) but not fsync'ed: after a power loss a few acknowledged batches may be sent again, which
the collector de-duplicates by (agent_id, seq).

Bound: when the segments would exceed `max_bytes`, whole segments are dropped, oldest first, and the samples
they held that were never acknowledged are added to `dropped_samples_total`, which the next batch reports.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import threading
from collections import deque
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

_SUFFIX = ".jsonl"


class SpoolError(Exception):
    """The spool directory cannot be used (permissions, another agent holds it)."""


@dataclass(frozen=True)
class SpoolRecord:
    segment: int
    offset: int
    length: int  # without the newline
    samples: int


def _samples_in(line: bytes) -> int:
    return len(json.loads(line)["samples"]["ts"])


class Spool:
    def __init__(self, directory: str | Path, *, max_bytes: int = 256 << 20, segment_bytes: int | None = None,
                 fsync: bool = True):
        self.directory = Path(directory)
        self.max_bytes = max_bytes
        # small enough that dropping one segment when full loses a small share of the spool
        self.segment_bytes = segment_bytes or max(64 << 10, min(8 << 20, max_bytes // 16))
        self.fsync = fsync
        self.dropped_samples_total = 0
        self._in_flight: SpoolRecord | None = None  # what peek() last handed to the shipper
        self._orphan: SpoolRecord | None = None     # the in-flight batch a drop removed: lost unless acked
        self._lock = threading.Lock()
        self._index: deque[SpoolRecord] = deque()
        self._sizes: dict[int, int] = {}  # segment -> bytes on disk
        self._fd: int | None = None  # the active (last) segment, opened for append
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            self._lock_fd = os.open(self.directory / "lock", os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise SpoolError(f"cannot use spool directory {self.directory}: {exc.strerror}") from None
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(self._lock_fd)
            raise SpoolError(f"spool {self.directory} is in use by another agent") from None
        self._load()

    # ------------------------------------------------------------------------------------------ opening

    def _path(self, segment: int) -> Path:
        return self.directory / f"{segment:012d}{_SUFFIX}"

    def _read_ack(self) -> tuple[int, int]:
        try:
            seg, off = (self.directory / "ack").read_text().split()
            return int(seg), int(off)
        except (FileNotFoundError, ValueError):
            return 0, 0

    def _load(self) -> None:
        try:
            self.dropped_samples_total = int((self.directory / "dropped").read_text().strip() or 0)
        except (FileNotFoundError, ValueError):
            self.dropped_samples_total = 0
        ack_seg, ack_off = self._read_ack()
        segments = sorted(int(p.name[: -len(_SUFFIX)]) for p in self.directory.glob("*" + _SUFFIX)
                          if p.name[: -len(_SUFFIX)].isdigit())
        for seg in segments:
            path = self._path(seg)
            if seg < ack_seg:
                path.unlink(missing_ok=True)  # fully acknowledged before the last shutdown
                continue
            data = path.read_bytes()
            end = data.rfind(b"\n") + 1
            if end < len(data):
                log.warning("spool %s: discarding a torn last record (%d bytes, the agent was killed mid-write)",
                            path.name, len(data) - end)
                with open(path, "r+b") as f:
                    f.truncate(end)
                    os.fsync(f.fileno())
                data = data[:end]
            self._sizes[seg] = len(data)
            offset = 0
            for line in data.split(b"\n")[:-1]:
                rec_off, offset = offset, offset + len(line) + 1
                if seg == ack_seg and rec_off < ack_off:
                    continue
                try:
                    samples = _samples_in(line)
                except (ValueError, KeyError, TypeError):
                    log.warning("spool %s: skipping an unreadable record at byte %d", path.name, rec_off)
                    continue
                self._index.append(SpoolRecord(seg, rec_off, len(line), samples))
        if segments and self._sizes:
            last = max(self._sizes)
            self._open_segment(last)
        log.info("spool %s: %d unacknowledged batches, %d bytes", self.directory, len(self._index),
                 self.pending_bytes())

    def _open_segment(self, segment: int) -> None:
        if self._fd is not None:
            os.close(self._fd)
        self._fd = os.open(self._path(segment), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self._active = segment
        self._sizes.setdefault(segment, 0)
        if self.fsync:
            dir_fd = os.open(self.directory, os.O_RDONLY)
            try:
                os.fsync(dir_fd)  # the new file's directory entry
            finally:
                os.close(dir_fd)

    # ------------------------------------------------------------------------------------------ writing

    def append(self, line: str | bytes, samples: int) -> None:
        """Write one batch (a JSON line without newline) durably; drop the oldest segments if full."""
        data = (line.encode() if isinstance(line, str) else line)
        if b"\n" in data:
            raise ValueError("a spool record must be a single line")
        with self._lock:
            if self._fd is None:
                self._open_segment(max(self._sizes, default=0) + 1)
            elif self._sizes[self._active] and self._sizes[self._active] + len(data) + 1 > self.segment_bytes:
                self._open_segment(self._active + 1)
            while sum(self._sizes.values()) + len(data) + 1 > self.max_bytes and len(self._sizes) > 1:
                self._drop_oldest()
            assert self._fd is not None
            offset = self._sizes[self._active]
            os.write(self._fd, data + b"\n")
            if self.fsync:
                os.fsync(self._fd)
            self._sizes[self._active] = offset + len(data) + 1
            self._index.append(SpoolRecord(self._active, offset, len(data), samples))

    def _count_dropped(self, samples: int) -> None:
        """Add to the drop counter and persist it: it must survive restarts (the server keeps the node's total)."""
        self.dropped_samples_total += samples
        tmp = self.directory / "dropped.tmp"
        tmp.write_text(f"{self.dropped_samples_total}\n")
        os.replace(tmp, self.directory / "dropped")

    def _drop_oldest(self) -> None:
        seg = min(self._sizes)
        lost = 0
        while self._index and self._index[0].segment == seg:
            rec = self._index.popleft()
            if rec == self._in_flight:
                # The shipper is sending it right now: it counts as dropped only if that send fails.
                self._orphan = rec
            else:
                lost += rec.samples
        del self._sizes[seg]
        self._path(seg).unlink(missing_ok=True)
        if lost:
            self._count_dropped(lost)
            log.warning("spool %s is full (%d bytes): dropped segment %d with %d unsent samples "
                        "(%d dropped in total)", self.directory, self.max_bytes, seg, lost,
                        self.dropped_samples_total)

    # ------------------------------------------------------------------------------------------ reading

    def peek(self) -> tuple[SpoolRecord, bytes] | None:
        """The oldest unacknowledged batch and its bytes, or None when everything was acknowledged."""
        with self._lock:
            if self._orphan is not None:
                # the batch dropped while in flight was not acknowledged: now it is lost
                self._count_dropped(self._orphan.samples)
                log.warning("spool %s: a batch of %d samples dropped while being sent was not acknowledged",
                            self.directory, self._orphan.samples)
                self._orphan = None
            if not self._index:
                self._in_flight = None
                return None
            rec = self._index[0]
            self._in_flight = rec
            with open(self._path(rec.segment), "rb") as f:
                f.seek(rec.offset)
                return rec, f.read(rec.length)

    def ack(self, record: SpoolRecord) -> None:
        """The collector has the batch: forget it (if it was dropped meanwhile, it was delivered after all)."""
        if not self._remove(record):
            with self._lock:
                if record == self._orphan:
                    self._orphan = None

    def discard(self, record: SpoolRecord, reason: str) -> None:
        """The collector refused the batch for good (4xx): drop it and count its samples."""
        removed = self._remove(record)
        with self._lock:
            if not removed and record == self._orphan:
                self._orphan, removed = None, True
        if removed:
            with self._lock:
                self._count_dropped(record.samples)
            log.error("dropped a batch of %d samples the collector refused: %s", record.samples, reason)

    def _remove(self, record: SpoolRecord) -> bool:
        with self._lock:
            if not self._index or self._index[0] != record:
                return False
            self._index.popleft()
            nxt = self._index[0] if self._index else None
            ack_seg, ack_off = (nxt.segment, nxt.offset) if nxt else (record.segment, record.offset + record.length + 1)
            tmp = self.directory / "ack.tmp"
            tmp.write_text(f"{ack_seg} {ack_off}\n")
            os.replace(tmp, self.directory / "ack")
            # segments wholly before the ack position are done
            for seg in [s for s in self._sizes if s < ack_seg]:
                del self._sizes[seg]
                self._path(seg).unlink(missing_ok=True)
            return True

    # ------------------------------------------------------------------------------------------ state

    def __len__(self) -> int:
        with self._lock:
            return len(self._index)

    def pending_bytes(self) -> int:
        return sum(r.length + 1 for r in self._index)

    def disk_bytes(self) -> int:
        with self._lock:
            return sum(self._sizes.values())

    def close(self) -> None:
        with self._lock:
            if self._orphan is not None:  # dropped while in flight and never acknowledged
                self._count_dropped(self._orphan.samples)
                self._orphan = None
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None
            if self._lock_fd >= 0:
                os.close(self._lock_fd)  # releases the flock
                self._lock_fd = -1

    def __enter__(self) -> Spool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
