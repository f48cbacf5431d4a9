"""Late samples and the hourly rollups (server.fleet.service: note_late_samples, backlog_spans): hours that get
samples after the periodic sweep passed them are rolled up again; hours past the raw retention are not (their
rollups would be replaced by the late part alone)."""

from __future__ import annotations

import time

from sqlalchemy import func, select

from tests.server.helpers import auth, sample_batch


def _backlog(db_session) -> list[tuple[int, float]]:  # type: ignore[no-untyped-def]
    from server.models import RollupBacklog
    from server.models.base import to_epoch

    db_session.expire_all()
    return [(k, to_epoch(h)) for k, h in db_session.execute(
        select(RollupBacklog.range_k, RollupBacklog.hour).order_by(RollupBacklog.range_k, RollupBacklog.hour))]


def _hourly(db_session) -> dict[float, int]:  # type: ignore[no-untyped-def]
    from server.models import GpuHourly
    from server.models.base import to_epoch

    db_session.expire_all()
    return {to_epoch(h): n for h, n in db_session.execute(
        select(GpuHourly.hour, func.sum(GpuHourly.samples)).group_by(GpuHourly.hour))}


def test_samples_arriving_hours_late_are_rolled_up_through_the_backlog(api, make_token, db_session) -> None:  # type: ignore[no-untyped-def]
    from server.fleet.service import RECENT_HOURS, backlog_spans, rollup_hours

    agent = make_token("agent", node="n")
    now = time.time()
    hour = now - now % 3600 - 5 * 3600  # an hour five hours back: out of the recent sweep's reach
    fresh = sample_batch(node="n", agent_id="a", seq=0, n=60, gpus=2, t0=now - 120)
    late = sample_batch(node="n", agent_id="a", seq=1, n=2 * 3600 // 10, gpus=2, t0=hour + 5)
    late["samples"]["ts"] = [hour + 5 + 10 * (k // 2) for k in range(len(late["samples"]["ts"]))]  # 2 h, every 10 s
    assert api.post("/api/v1/ingest/samples", json=fresh, headers=auth(agent)).status_code == 200
    assert _backlog(db_session) == []  # on time: nothing to note
    assert api.post("/api/v1/ingest/samples", json=late, headers=auth(agent)).status_code == 200
    assert _backlog(db_session) == [(0, hour), (0, hour + 3600)]
    assert "\nfleetprof_rollup_backlog_hours 2\n" in api.get("/metrics/fleet").text  # what an operator can alert on

    rollup_hours(db_session, since=now - RECENT_HOURS * 3600, until=now)  # the periodic sweep
    db_session.commit()
    assert hour not in _hourly(db_session)  # never reached by it
    spans = backlog_spans(db_session, now=now, raw_retention_days=30)
    assert spans == [(0, hour, hour + 3600)]  # consecutive hours: one run
    for k, first, last in spans:
        rollup_hours(db_session, since=first, until=last, now=now, ranges=[k])
    db_session.commit()
    hourly = _hourly(db_session)
    assert hourly[hour] == 2 * 360 and hourly[hour + 3600] == 2 * 360  # every late sample, in its hour
    assert _backlog(db_session) == []  # done
    assert "\nfleetprof_rollup_backlog_hours 0\n" in api.get("/metrics/fleet").text


def test_backlog_hours_past_the_raw_retention_keep_their_rollups(api, make_token, db_session) -> None:  # type: ignore[no-untyped-def]
    from server.fleet.service import backlog_spans, rollup_hours

    agent = make_token("agent", node="n")
    now = time.time()
    hour = now - now % 3600 - 3 * 86400
    full = sample_batch(node="n", agent_id="a", seq=0, n=600, gpus=1, t0=hour + 60)
    assert api.post("/api/v1/ingest/samples", json=full, headers=auth(agent)).status_code == 200
    rollup_hours(db_session, since=hour, until=hour, now=now)  # rolled up in its time; its backlog row done
    db_session.commit()
    assert _hourly(db_session)[hour] == 600 and _backlog(db_session) == []
    more = sample_batch(node="n", agent_id="a", seq=1, n=60, gpus=1, t0=hour + 3000)  # then a straggler batch
    assert api.post("/api/v1/ingest/samples", json=more, headers=auth(agent)).status_code == 200
    assert _backlog(db_session) == [(0, hour)]
    # With a 2-day retention, that day's raw samples are (or will be) dropped: rolling it up again from what is
    # left would replace the rollup by a part of it. The backlog row goes, the rollup stays.
    assert backlog_spans(db_session, now=now, raw_retention_days=2) == []
    db_session.commit()
    assert _backlog(db_session) == [] and _hourly(db_session)[hour] == 600
