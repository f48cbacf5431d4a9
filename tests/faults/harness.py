"""Plain helpers for the fault tests: subprocesses in their own process groups, tokens, the journaling agent,
waiting, and reading back what the database stored."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from server.models.base import epoch_us
from tests.conftest import REPO_ROOT, free_port, wait_http
from tests.server.helpers import gz, sample_batch

PYTHON = sys.executable


# ------------------------------------------------------------------------------------------ processes


@dataclass
class Proc:
    """A subprocess in its own session (process group), with its log file."""

    name: str
    argv: list[str]
    env: dict[str, str]
    log_path: Path
    popen: subprocess.Popen[bytes] | None = None
    extra: dict[str, object] = field(default_factory=dict)

    def start(self) -> Proc:
        log = open(self.log_path, "ab")
        self.popen = subprocess.Popen(self.argv, env=self.env, cwd=REPO_ROOT, stdout=log, stderr=subprocess.STDOUT,
                                      start_new_session=True)
        log.close()
        return self

    @property
    def pid(self) -> int:
        assert self.popen is not None
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def kill9(self) -> None:
        """SIGKILL the whole process group (the process and any children it forked)."""
        if self.popen is None:
            return
        try:
            os.killpg(self.popen.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.popen.wait(10)

    def stop(self, timeout: float = 20) -> int | None:
        """SIGTERM, wait; SIGKILL the group past the timeout. Returns the exit code."""
        if self.popen is None:
            return None
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill9()
        try:  # leftovers of the group (celery pool children)
            os.killpg(self.popen.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        return self.popen.returncode

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


def base_env(database_url: str, tmp_path: Path, *, broker_url: str | None = None, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEETPROF_")}
    env.update(FLEETPROF_DATABASE_URL=database_url, FLEETPROF_DATA_DIR=str(tmp_path / "data"),
               FLEETPROF_QUEUE_NAME=f"faults{os.getpid()}", PYTHONUNBUFFERED="1")
    if broker_url:
        env["FLEETPROF_BROKER_URL"] = broker_url
    env.update(extra)
    return env


def create_token(env: dict[str, str], scope: str, node: str | None = None, team: str | None = None) -> str:
    """A token in the database `env` points at (what `fleetprof token create` does, without its 2-s start)."""
    from sqlalchemy import create_engine

    from server.auth.service import create_token as create
    from server.db import make_sessionmaker, session_scope

    engine = create_engine(env["FLEETPROF_DATABASE_URL"])
    try:
        with session_scope(make_sessionmaker(engine)) as session:
            return create(session, scope=scope, team=team, node=node)
    finally:
        engine.dispose()


def start_collector(procs: list[Proc], env: dict[str, str], tmp_path: Path, port: int | None = None,
                    name: str = "collector") -> tuple[Proc, str]:
    port = port or free_port()
    p = Proc(name, [PYTHON, "-m", "fleetprof.cli", "server", "--port", str(port)], env,
             tmp_path / f"{name}.log").start()
    procs.append(p)
    url = f"http://127.0.0.1:{port}"
    wait_http(url + "/healthz", timeout_s=30)
    return p, url


def start_agent(procs: list[Proc], env: dict[str, str], tmp_path: Path, *, server: str, token: str, node: str,
                gpus: int = 4, interval_s: float = 0.1, batch_interval_s: float = 0.3,
                spool_max_bytes: int | None = None, name: str = "agent") -> Proc:
    """The real agent CLI (`fleetprof agent`, fake:N GPUs) under tests/faults/journaling_agent.py, which records
    every collector answer and every spooled batch in a journal (see that file)."""
    journal = tmp_path / f"{name}.journal.jsonl"
    agent_env = {k: v for k, v in env.items() if k not in ("FLEETPROF_DATABASE_URL", "FLEETPROF_BROKER_URL")}
    agent_env.update(FLEETPROF_BATCH_INTERVAL_S=str(batch_interval_s), FLEETPROF_SHIP_BACKOFF_MAX_S="1",
                     FLEETPROF_HTTP_TIMEOUT_S="5", FLEETPROF_FAST_INTERVAL_S="0")
    if spool_max_bytes is not None:
        agent_env["FLEETPROF_SPOOL_MAX_BYTES"] = str(spool_max_bytes)
    argv = [PYTHON, "-m", "tests.faults.journaling_agent", str(journal), "agent", "--server", server,
            "--token", token, "--source", f"fake:{gpus}", "--spool", str(tmp_path / f"{name}.spool"),
            "--interval", str(interval_s), "--node", node]
    p = Proc(name, argv, agent_env, tmp_path / f"{name}.log").start()
    p.extra["journal"] = journal
    procs.append(p)
    return p


def stop_agent_and_drain(procs: list[Proc], agent: Proc, *, rounds: int = 3) -> int:
    """SIGTERM the agent: it cuts a last batch and gets 3 s to flush. What it could not deliver in that time
    stays in its durable spool for the next start ("N batches stay spooled" in its log), so start it again on
    the same spool (same journal) until a stop leaves nothing behind. Returns how many restarts that took."""
    journal: Path = agent.extra["journal"]  # type: ignore[assignment]
    proc = agent
    for i in range(rounds + 1):
        code = proc.stop(timeout=20)
        assert code == 0, f"agent exited with {code}\n{proc.log()[-3000:]}"
        left = re.findall(r"(\d+) batches stay spooled", proc.log())
        if not left:
            return i
        n = int(left[-1])
        view = JournalView.read(journal)
        old_ids = {agent_id for agent_id, _ in view.spooled}
        before = sum(1 for agent_id, _ in view.acked if agent_id in old_ids)
        proc = Proc(f"{agent.name}-restart{i + 1}", agent.argv, agent.env,
                    agent.log_path.with_name(f"{agent.name}-restart{i + 1}.log")).start()
        procs.append(proc)
        wait_until(lambda: sum(1 for agent_id, _ in JournalView.read(journal).acked if agent_id in old_ids)
                   >= before + n, 40, f"the restarted agent to deliver the {n} batches left in the spool")
    raise AssertionError(f"the spool still held batches after {rounds} restarts")


def read_journal(path: Path) -> list[dict]:
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:  # a torn last line (the journaling process was killed mid-write)
            pass
    return out


def wait_until(predicate, timeout_s: float, what: str, interval_s: float = 0.1):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}")
        time.sleep(interval_s)


def http_status(method: str, url: str, **kwargs: object) -> tuple[int | None, httpx.Headers | None]:
    try:
        r = httpx.request(method, url, timeout=kwargs.pop("timeout", 10), **kwargs)  # type: ignore[arg-type]
        return r.status_code, r.headers
    except httpx.HTTPError:
        return None, None


# ------------------------------------------------------------------------------------------ what was stored


def stored_samples(database_url: str) -> Counter[tuple[str, int]]:
    """(gpu uuid, ts in integer microseconds) -> how many rows gpu_samples holds for it."""
    from sqlalchemy import create_engine, text

    engine = create_engine(database_url)
    try:
        with engine.connect() as conn:
            rows = conn.execute(text(
                "SELECT g.uuid, round(extract(epoch from s.ts) * 1000000)::bigint FROM gpu_samples s "
                "JOIN gpus g ON g.id = s.gpu_id")).all()
    finally:
        engine.dispose()
    return Counter((uuid, int(us)) for uuid, us in rows)


def ledger(database_url: str) -> dict[tuple[str, int], int]:
    """The idempotency ledger: (agent_id, seq) -> rows, for sample batches."""
    from sqlalchemy import create_engine, text

    engine = create_engine(database_url)
    try:
        with engine.connect() as conn:
            rows = conn.execute(text("SELECT source_id, seq, rows FROM ingest_batches WHERE kind = 'samples'")).all()
    finally:
        engine.dispose()
    return {(src, int(seq)): int(n) for src, seq, n in rows}




def us(ts: float) -> int:
    """Integer microseconds since 1970 exactly as Postgres' to_timestamp(float8) rounds them."""
    return epoch_us(ts)


@dataclass
class JournalView:
    """What the journaling agent spooled, and what the collector acknowledged."""

    spooled: dict[tuple[str, int], list[tuple[str, int]]]  # (agent_id, seq) -> [(uuid, ts_us)]
    acked: dict[tuple[str, int], dict]                      # (agent_id, seq) -> first ack
    ack_count: Counter[tuple[str, int]]                     # how often each batch was acknowledged
    errors: list[dict]
    dropped_samples_total: int

    @classmethod
    def read(cls, path: Path) -> JournalView:
        spooled: dict[tuple[str, int], list[tuple[str, int]]] = {}
        acked: dict[tuple[str, int], dict] = {}
        count: Counter[tuple[str, int]] = Counter()
        errors: list[dict] = []
        dropped = 0
        for ev in read_journal(path):
            kind = ev["ev"]
            if kind == "spooled":
                spooled[(ev["agent_id"], ev["seq"])] = [(u, us(t)) for u, t in ev["samples"]]
                # the count the agent reports with each batch (it also grows outside segment drops)
                dropped = max(dropped, ev.get("dropped_samples_total", 0))
            elif kind == "ack":
                key = (ev["agent_id"], ev["seq"])
                acked.setdefault(key, ev)
                count[key] += 1
            elif kind == "error":
                errors.append(ev)
            elif kind == "dropped":
                dropped = max(dropped, ev["dropped_samples_total"])
        return cls(spooled, acked, count, errors, dropped)

    def acked_samples(self) -> Counter[tuple[str, int]]:
        out: Counter[tuple[str, int]] = Counter()
        for key in self.acked:
            out.update(self.spooled[key])
        return out

    def spooled_samples(self) -> Counter[tuple[str, int]]:
        out: Counter[tuple[str, int]] = Counter()
        for rows in self.spooled.values():
            out.update(rows)
        return out

    def error_statuses(self) -> Counter[int | None]:
        return Counter(e["status"] for e in self.errors)


def assert_exactly_once(database_url: str, view: JournalView, *, require_all_spooled: bool = True) -> dict:
    """Every acknowledged sample is stored exactly once; with require_all_spooled, so is every spooled one
    (the agent drained its spool). Only the agent's own GPUs are looked at. Returns figures for the report."""
    spooled = view.spooled_samples()
    gpus = {uuid for uuid, _ in spooled}
    stored = Counter({k: n for k, n in stored_samples(database_url).items() if k[0] in gpus})
    dup = {k: n for k, n in stored.items() if n != 1}
    assert not dup, f"{len(dup)} (gpu, ts) keys stored more than once, e.g. {list(dup.items())[:3]}"
    acked = view.acked_samples()
    assert acked, "the agent got no acknowledgement at all"
    missing = [k for k in acked if k not in stored]
    if missing:
        book = ledger(database_url)
        lost = sorted({key for key, rows in view.spooled.items() if key in view.acked and set(rows) & set(missing)})
        detail = [(key, view.acked[key], book.get(key)) for key in lost[:5]]
        raise AssertionError(f"{len(missing)} acknowledged samples are not in gpu_samples, from {len(lost)} "
                             f"batches; (batch, its ack, its ledger rows): {detail}")
    extra = [k for k in stored if k not in spooled]
    assert not extra, f"{len(extra)} stored samples were never spooled by the agent, e.g. {extra[:3]}"
    if require_all_spooled:
        unacked = [key for key in view.spooled if key not in view.acked]
        assert not unacked, f"{len(unacked)} spooled batches were never acknowledged (e.g. {unacked[:3]})"
        assert sum(stored.values()) == sum(spooled.values())
    # The ledger: each acknowledged batch claimed once, with the rows it carried.
    book = ledger(database_url)
    for key in view.acked:
        assert key in book, f"acknowledged batch {key} has no idempotency row"
        assert book[key] == len(view.spooled[key])
    return {"stored": sum(stored.values()), "acked_batches": len(view.acked),
            "resent_acks": sum(n - 1 for n in view.ack_count.values()),
            "duplicate_acks": sum(1 for ev in view.acked.values() if ev.get("duplicate")),
            "errors": dict(view.error_statuses())}


class Sender(threading.Thread):
    """Posts batches of 2 GPUs x 500 samples, one after the other, each retried until a 200."""

    def __init__(self, url: str, token: str, node: str = "sender-node"):
        super().__init__(daemon=True)
        self.node = node
        self.pending_keys: list[tuple[str, int]] | None = None
        self.url = url
        self.token = token
        self.answers: list[tuple[int | None, str | None]] = []
        self.acked_keys: dict[int, list[tuple[str, int]]] = {}
        self.duplicates = 0
        self._halt = threading.Event()
        self.t0 = time.time() - 30 * 86_400  # batch k covers [t0 + 500 k, t0 + 500 k + 500)

    @property
    def acked(self) -> int:
        return len(self.acked_keys)

    def assert_exactly_once(self, database_url: str) -> None:
        """Every batch the collector acknowledged to the sender is stored, each sample exactly once."""
        stored = stored_samples(database_url)
        for seq, keys in self.acked_keys.items():
            bad = [k for k in keys if stored.get(k) != 1]
            assert not bad, f"sender batch {seq}: {len(bad)} acknowledged samples not stored exactly once"
        mine = sum(n for (uuid, _), n in stored.items() if uuid.startswith(f"GPU-{self.node}-"))
        assert mine == sum(len(k) for k in self.acked_keys.values()) + self.unacked_stored_allowance(stored)

    def unacked_stored_allowance(self, stored: Counter[tuple[str, int]]) -> int:
        """Samples of the one batch in flight when the sender stopped: committed but never acknowledged."""
        if self.pending_keys is None:
            return 0
        return sum(1 for k in self.pending_keys if k in stored)

    def stop(self) -> None:
        self._halt.set()
        self.join(30)

    def run(self) -> None:
        seq = 0
        with httpx.Client(timeout=10) as client:
            while not self._halt.is_set():
                seq += 1
                batch = sample_batch(node=self.node, agent_id=f"{self.node}-sender", seq=seq, n=500, gpus=2,
                                     t0=self.t0 + seq * 500)
                body = gz(batch)
                self.pending_keys = [(u, us(t)) for u, t in zip(batch["samples"]["gpu_uuid"], batch["samples"]["ts"])]
                while not self._halt.is_set():
                    try:
                        r = client.post(self.url + "/api/v1/ingest/samples", content=body,
                                        headers={"Authorization": f"Bearer {self.token}", "Content-Encoding": "gzip",
                                                 "Content-Type": "application/json"})
                        self.answers.append((r.status_code, r.headers.get("Retry-After")))
                    except httpx.HTTPError:
                        self.answers.append((None, None))
                        time.sleep(0.2)
                        continue
                    if r.status_code == 200:
                        self.duplicates += bool(r.json().get("duplicate"))
                        self.acked_keys[seq], self.pending_keys = self.pending_keys, None
                        break
                    time.sleep(0.2)
