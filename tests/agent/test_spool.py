"""The durable spool: order, acknowledgement, restart, torn writes, the byte bound, and kill -9."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agent.spool import Spool, SpoolError


def line(seq: int, samples: int = 2, pad: int = 0) -> str:
    return json.dumps({"seq": seq, "samples": {"ts": [1.0] * samples}, "pad": "x" * pad})


def drain(spool: Spool) -> list[int]:
    out = []
    while (item := spool.peek()) is not None:
        rec, data = item
        out.append(json.loads(data)["seq"])
        spool.ack(rec)
    return out


def test_fifo_ack_and_restart(tmp_path: Path) -> None:
    with Spool(tmp_path, max_bytes=1 << 20, segment_bytes=200) as s:
        for i in range(10):
            s.append(line(i), 2)
        rec, data = s.peek()  # type: ignore[misc]
        assert json.loads(data)["seq"] == 0
        s.ack(rec)
        s.ack(rec)  # acknowledging twice is harmless
        assert len(s) == 9
    with Spool(tmp_path, max_bytes=1 << 20, segment_bytes=200) as s:
        assert drain(s) == list(range(1, 10))
        s.append(line(10), 1)
    with Spool(tmp_path, max_bytes=1 << 20, segment_bytes=200) as s:
        assert drain(s) == [10]
        assert len(list(tmp_path.glob("*.jsonl"))) == 1  # acknowledged segments are deleted


def test_one_owner_at_a_time(tmp_path: Path) -> None:
    with Spool(tmp_path), pytest.raises(SpoolError, match="in use"):
        Spool(tmp_path)


def test_torn_last_line_is_discarded(tmp_path: Path) -> None:
    with Spool(tmp_path) as s:
        s.append(line(1), 2)
        s.append(line(2), 2)
    seg = next(tmp_path.glob("*.jsonl"))
    with open(seg, "ab") as f:
        f.write(line(3).encode()[:17])  # killed mid-write: no newline
    with Spool(tmp_path) as s:
        assert drain(s) == [1, 2]
        s.append(line(4), 2)
    with Spool(tmp_path) as s:
        assert drain(s) == [4]


def test_bound_drops_oldest_and_counts_samples(tmp_path: Path) -> None:
    with Spool(tmp_path, max_bytes=4000, segment_bytes=1000) as s:
        for i in range(40):
            s.append(line(i, samples=3, pad=150), 3)
        assert s.disk_bytes() <= 4000
        kept = drain(s)
        assert kept == list(range(40 - len(kept), 40))  # the newest survive, in order
        assert s.dropped_samples_total == 3 * (40 - len(kept)) > 0


def test_discard_counts_refused_batches(tmp_path: Path) -> None:
    with Spool(tmp_path) as s:
        s.append(line(1, samples=5), 5)
        rec, _ = s.peek()  # type: ignore[misc]
        s.discard(rec, "HTTP 422")
        assert s.dropped_samples_total == 5 and s.peek() is None


WRITER = """
import sys, json
from agent.spool import Spool
s = Spool(sys.argv[1], max_bytes=1 << 30, segment_bytes=1 << 20)
pad = "y" * 20000
i = 0
while True:
    s.append(json.dumps({"seq": i, "samples": {"ts": [1.0]}, "pad": pad}), 1)
    print(i, flush=True)  # i is durable now
    i += 1
"""


def test_survives_kill_9_mid_write(tmp_path: Path, repo_root: Path) -> None:
    spool_dir = tmp_path / "spool"
    proc = subprocess.Popen([sys.executable, "-c", WRITER, str(spool_dir)], stdout=subprocess.PIPE, text=True,
                            cwd=repo_root, env={**os.environ, "PYTHONPATH": str(repo_root)})
    assert proc.stdout is not None
    confirmed = -1
    deadline = time.monotonic() + 20
    while confirmed < 30 and time.monotonic() < deadline:
        confirmed = int(proc.stdout.readline())
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    rest = proc.stdout.read().split()
    confirmed = int(rest[-1]) if rest else confirmed
    with Spool(spool_dir) as s:
        seqs = drain(s)
    # every batch the writer was told is spooled is there, in order, and nothing is torn
    assert seqs[: confirmed + 1] == list(range(confirmed + 1))
    assert len(seqs) <= confirmed + 2


@pytest.mark.parametrize("delivered", [True, False])
def test_a_batch_dropped_while_in_flight_counts_only_if_not_delivered(tmp_path: Path, delivered: bool) -> None:
    with Spool(tmp_path, max_bytes=4000, segment_bytes=1000) as s:
        for i in range(5):
            s.append(line(i, samples=3, pad=150), 3)
        rec, _ = s.peek()  # the shipper posts batch 0 ...
        for i in range(5, 40):  # ... while sampling goes on and the bound drops batch 0's segment
            s.append(line(i, samples=3, pad=150), 3)
        before = s.dropped_samples_total
        if delivered:
            s.ack(rec)  # its 200 arrived: it is stored, not lost
            assert s.dropped_samples_total == before
        kept = drain(s)
        lost = 40 - len(kept) - (1 if delivered else 0)
        assert s.dropped_samples_total == 3 * lost


def test_the_drop_count_survives_a_restart(tmp_path: Path) -> None:
    with Spool(tmp_path, max_bytes=4000, segment_bytes=1000) as s:
        for i in range(40):
            s.append(line(i, samples=3, pad=150), 3)
        counted = s.dropped_samples_total
    assert counted > 0
    with Spool(tmp_path, max_bytes=4000, segment_bytes=1000) as s:
        assert s.dropped_samples_total == counted  # the node's total must not restart from 0
