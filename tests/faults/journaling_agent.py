"""The real `fleetprof agent` CLI, with a journal of what it spooled and what the collector answered.

    python -m tests.faults.journaling_agent JOURNAL agent --server URL --token T --source fake:4 ...

Nothing in the agent's behaviour changes: the sampler, the durable spool, the shipper's retry policy and the
HTTP transport are the production code. Three methods are wrapped to append one JSON line per event to
JOURNAL (O_APPEND, one write per line, so a line is whole or absent):

- `Spool.append` -> {"ev": "spooled", "agent_id", "seq", "n", "samples": [[gpu_uuid, ts], ...]}
- `Client.request` on the samples path -> {"ev": "ack", "agent_id", "seq", "accepted", "duplicate"} after a
  2xx (the collector's acknowledgement: it answers only after its commit), or {"ev": "error", "status",
  "retry_after_s", "seq"} for every refused or failed attempt (status null = network error);
- `Spool._drop_oldest` -> {"ev": "dropped", "dropped_samples_total"} when the bounded spool drops a segment.

The fault tests compare the database with these acknowledgements: every acknowledged sample stored, exactly
once.
"""

from __future__ import annotations

import json
import os
import sys


def _install(journal_path: str) -> None:
    from agent import spool as spool_mod
    from fleetprof import client as transport_mod

    fd = os.open(journal_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def write(event: dict) -> None:
        os.write(fd, (json.dumps(event, separators=(",", ":")) + "\n").encode())

    orig_append = spool_mod.Spool.append

    def append(self, line, samples):  # type: ignore[no-untyped-def]
        orig_append(self, line, samples)
        batch = json.loads(line)
        write({"ev": "spooled", "agent_id": batch["agent_id"], "seq": batch["seq"], "n": samples,
               "dropped_samples_total": batch.get("dropped_samples_total", 0),
               "samples": list(zip(batch["samples"]["gpu_uuid"], batch["samples"]["ts"]))})

    orig_drop = spool_mod.Spool._drop_oldest

    def drop_oldest(self):  # type: ignore[no-untyped-def]
        orig_drop(self)
        write({"ev": "dropped", "dropped_samples_total": self.dropped_samples_total})

    orig_request = transport_mod.Client.request

    def request(self, method, path, *, raw_body=None, **kwargs):  # type: ignore[no-untyped-def]
        if not path.endswith("/ingest/samples") or raw_body is None:
            return orig_request(self, method, path, raw_body=raw_body, **kwargs)
        head = json.loads(raw_body)
        key = {"agent_id": head["agent_id"], "seq": head["seq"]}
        try:
            resp = orig_request(self, method, path, raw_body=raw_body, **kwargs)
        except transport_mod.ApiError as exc:
            write({"ev": "error", **key, "status": exc.status, "retry_after_s": exc.retry_after_s,
                   "message": str(exc)[:300]})
            raise
        body = resp.body if isinstance(resp.body, dict) else {}
        write({"ev": "ack", **key, "status": resp.status, "accepted": body.get("accepted"),
               "duplicate": body.get("duplicate")})
        return resp

    spool_mod.Spool.append = append  # type: ignore[method-assign]
    spool_mod.Spool._drop_oldest = drop_oldest  # type: ignore[method-assign]
    transport_mod.Client.request = request  # type: ignore[method-assign]


def main() -> int:
    journal, *argv = sys.argv[1:]
    _install(journal)
    from fleetprof.cli import main as cli_main

    return cli_main(argv)


if __name__ == "__main__":
    sys.exit(main())
