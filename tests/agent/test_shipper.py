"""The shipper against the collector double: outages, Retry-After, lost acks, refusals, clock skew."""

from __future__ import annotations

import threading
from pathlib import Path

from agent.shipper import Shipper
from agent.spool import Spool
from fleetprof.client import Client
from fleetprof.protocol import PROTOCOL_VERSION, SampleBatch, SampleColumns
from fleetprof.recordings import dump_batch_line
from tests.agent.collector import Collector


def batch(seq: int, n: int = 2) -> SampleBatch:
    return SampleBatch(protocol_version=PROTOCOL_VERSION, node="n1", agent_id="n1-a", seq=seq,
                       sent_at=1_800_000_000.0, source="test",
                       samples=SampleColumns(ts=[1_800_000_000.0 + seq] * n, gpu_uuid=[f"GPU-{i}" for i in range(n)],
                                             memory_used_bytes=[1 << 30] * n))


def fill(spool: Spool, seqs: range) -> None:
    for i in seqs:
        spool.append(dump_batch_line(batch(i)), 2)


def shipper(tmp_path: Path, collector: Collector, **kw: object) -> Shipper:
    spool = Spool(tmp_path / "spool")
    return Shipper(spool, Client(collector.url, "tok"), backoff_base_s=0.01, backoff_max_s=0.05,
                   rng=lambda: 0.5, **kw)  # type: ignore[arg-type]


def test_outage_then_recovery_delivers_everything_exactly_once(tmp_path: Path, collector: Collector) -> None:
    sh = shipper(tmp_path, collector)
    collector.down()
    fill(sh.spool, range(1, 11))
    stop = threading.Event()
    t = threading.Thread(target=sh.run, args=(stop,))
    t.start()
    try:
        assert not collector.wait_for(lambda: collector.batches, timeout_s=0.5)
        assert sh.failures > 0 and len(sh.spool) == 10
        collector.up()  # same port
        fill(sh.spool, range(11, 16))
        sh.notify()
        assert collector.wait_for(lambda: len(sh.spool) == 0)
    finally:
        stop.set()
        t.join(5)
    assert sorted(seq for _, seq in collector.batches) == list(range(1, 16))
    assert collector.duplicates == 0


def test_lost_acknowledgement_is_resent_and_deduplicated(tmp_path: Path, collector: Collector) -> None:
    sh = shipper(tmp_path, collector)
    fill(sh.spool, range(1, 4))
    collector.lose_acks = 1
    assert sh.ship_once() is not None  # committed but unacknowledged: still spooled
    assert len(sh.spool) == 3
    assert sh.flush(5)
    assert collector.duplicates == 1 and sh.duplicate_batches == 1
    assert sorted(seq for _, seq in collector.batches) == [1, 2, 3]


def test_retry_after_is_honoured_and_refused_batches_are_counted(tmp_path: Path, collector: Collector) -> None:
    sh = shipper(tmp_path, collector)
    fill(sh.spool, range(1, 3))
    collector.status, collector.retry_after = 429, "7"
    delay = sh.ship_once()
    assert delay is not None and 7.0 <= delay <= 8.0
    collector.status, collector.retry_after = 503, None
    assert sh.ship_once() is not None and len(sh.spool) == 2
    collector.status = 422
    assert sh.ship_once() is None  # never acceptable: dropped, counted
    assert sh.spool.dropped_samples_total == 2 and len(sh.spool) == 1
    collector.status = 401
    assert sh.ship_once() == sh.backoff_max_s and len(sh.spool) == 1  # auth problems keep the data
    collector.status = None
    assert sh.flush(5) and sorted(seq for _, seq in collector.batches) == [2]


def test_clock_skew_from_the_acknowledgement(tmp_path: Path, collector: Collector) -> None:
    sh = shipper(tmp_path, collector)
    fill(sh.spool, range(1, 2))
    collector.clock_offset_s = -30.0  # the server is 30 s behind us
    assert sh.flush(5)
    assert sh.clock_skew_s is not None and 29.0 < sh.clock_skew_s < 31.0
