"""Schemathesis over the OpenAPI document of a real `fleetprof server`, with an operator token: no 5xx, ever.

Every operation gets FUZZ_EXAMPLES schema-valid and as many schema-invalid requests (hypothesis-generated,
database off so each run is fresh); operations with a {job_id} are also aimed at a job that exists, so the
fuzzing reaches past the 404. The failures are gathered over all operations, then reported together.
The stateful test follows the document's links instead: register a job, ingest for it, upload a trace, read it back.
"""

from __future__ import annotations

import time

import httpx
import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode

from tests.server.helpers import auth, sample_batch

FUZZ_EXAMPLES = 30  # per operation and generation mode: ~900 requests over the 14 operations of today
JOB = "fuzz-job"
KINETO = (b'{"schemaVersion": 1, "traceEvents": [{"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, '
          b'"ts": 1000, "dur": 50, "args": {"device": 0, "stream": 7}}]}')


def _seed(url: str, operator: str, agent: str) -> None:
    now = time.time()
    with httpx.Client(base_url=url, timeout=60) as c:
        assert c.post("/api/v1/ingest/samples", json=sample_batch(node="node-f", n=30, t0=now - 300),
                      headers=auth(agent)).status_code == 200
        assert c.post("/api/v1/jobs", json={"job_id": JOB, "team": "alpha", "node": "node-f", "state": "running",
                                            "started_at": now - 300, "gpu_uuids": ["GPU-node-f-0"]},
                      headers=auth(operator)).status_code == 200
        assert c.post(f"/api/v1/jobs/{JOB}/traces", content=KINETO, headers=auth(operator)).status_code == 200


def _dangling_refs(doc: dict) -> set[str]:
    import json
    import re

    refs = set(re.findall(r'"#/components/schemas/([^"]+)"', json.dumps(doc)))
    return refs - set(doc.get("components", {}).get("schemas", {}))


def test_the_openapi_document_has_no_dangling_refs(api):
    assert _dangling_refs(api.app.openapi()) == set()


@pytest.mark.slow
# ~110 s on a quiet 2-core machine, 290 s when the cores are shared: past the suite's 300 s default per test, which
# once cut a run short in the middle of an estimate (each POST /estimate starts a sandboxed interpreter)
@pytest.mark.timeout(900)
def test_fuzzing_the_openapi_schema_finds_no_server_error(live_server, make_token):
    operator = make_token("operator")
    _seed(live_server, operator, make_token("agent", node="*"))
    doc = httpx.get(live_server + "/openapi.json", timeout=30).json()
    schema = schemathesis.openapi.from_dict(doc)
    headers = {"Authorization": f"Bearer {operator}"}
    session = requests.Session()
    tried: dict[str, int] = {}
    spent_s: dict[str, float] = {}  # time to answer, per operation: where the suite's minutes go
    server_errors: list[str] = []
    for result in schema.get_all_operations():
        op = result.ok()
        label = f"{op.method.upper()} {op.path}"
        tried[label] = 0
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            strategies = [op.as_strategy(mode, headers=headers)]
            if "{job_id}" in op.path:
                strategies.append(op.as_strategy(mode, headers=headers, path_parameters={"job_id": JOB}))

            @given(case=st.one_of(strategies))
            @settings(max_examples=FUZZ_EXAMPLES, deadline=None, database=None, derandomize=False,
                      phases=[Phase.generate], suppress_health_check=list(HealthCheck))
            def run(case) -> None:  # type: ignore[no-untyped-def]
                case.headers = {**(case.headers or {}), **headers}
                try:
                    response = case.call(base_url=live_server, session=session, timeout=60)
                except (requests.exceptions.InvalidHeader, requests.exceptions.InvalidURL, UnicodeEncodeError,
                        ValueError):
                    return  # a request the HTTP client itself refuses to send
                except requests.exceptions.ConnectionError as exc:
                    server_errors.append(f"{label}: connection error {exc} for {case.as_curl_command()}")
                    return
                tried[label] += 1
                spent_s[label] = spent_s.get(label, 0.0) + float(response.elapsed)  # noqa: B023 - run() is called in this iteration
                if response.status_code >= 500:
                    server_errors.append(f"{label} -> {response.status_code}: {response.text[:300]}\n  "
                                         f"{case.as_curl_command()}")

            try:
                run()
            except Unsatisfiable:
                assert mode is GenerationMode.NEGATIVE, label  # nothing to get wrong (e.g. GET /healthz)
    total = sum(tried.values())
    print(f"schemathesis: {total} requests over {len(tried)} operations, {len(server_errors)} 5xx")
    for label, n in sorted(tried.items()):
        print(f"  {n:5d}  {spent_s.get(label, 0.0):6.1f} s  {label}")
    assert len(tried) >= 14 and total >= len(tried) * FUZZ_EXAMPLES
    assert server_errors == [], "\n".join(server_errors[:30])


STATEFUL_SCENARIOS = 25  # hypothesis examples of the state machine, each up to STATEFUL_STEPS linked calls
STATEFUL_STEPS = 6
# Test-only link (its body holds constants no client should copy): a registered job gets a step event.
INGEST_STEP_LINK = {"operationRef": "#/paths/~1api~1v1~1ingest~1events/post", "requestBody": {
    "protocol_version": 1, "source_id": "fuzz-stateful", "seq": 0, "sent_at": 1.7e9,
    "events": [{"kind": "step", "job_id": "$response.body#/job_id", "ts": 1.7e9, "step": 1, "wall_s": 0.25}]}}


@pytest.mark.slow
@pytest.mark.timeout(600)  # 30-80 s alone; a loaded machine may take several times that
def test_stateful_register_upload_read_finds_no_server_error(live_server, make_token):
    """Schemathesis' state machine over the document's links (POST /jobs answers with links to read the job, its
    report, series, steps and right-sizing, and to upload a trace): sequences of calls on jobs that exist, in
    positive and negative (schema-violating) data, with an operator token. No 5xx, and the links were followed."""
    operator = make_token("operator")
    _seed(live_server, operator, make_token("agent", node="*"))
    doc = httpx.get(live_server + "/openapi.json", timeout=30).json()
    links = doc["paths"]["/api/v1/jobs"]["post"]["responses"]["200"]["links"]
    assert len(links) >= 7  # the document's own links
    links["IngestStep"] = INGEST_STEP_LINK
    schema = schemathesis.openapi.from_dict(doc)
    # Only the links written down: schemathesis' own inference makes GET /jobs the sole entry point and never
    # registers a job (JobCreate names nodes and GPUs that no operation produces).
    schema.config.phases.stateful.inference.algorithms = []
    # The document declares the bearer scheme: left on, schemathesis writes Authorization headers of its own (most
    # calls were then 401s, and the links were rarely followed past POST /jobs).
    schema.config.generation.update(with_security_parameters=False)
    headers = {"Authorization": f"Bearer {operator}"}
    session = requests.Session()
    calls: list[tuple[str, int]] = []
    server_errors: list[str] = []

    class Machine(schema.as_state_machine()):  # type: ignore[misc]
        def get_call_kwargs(self, case):  # type: ignore[no-untyped-def]
            case.headers = {**(case.headers or {}), **headers}  # the operator's token, whatever was generated
            return {"base_url": live_server, "headers": headers, "session": session, "timeout": 60}

        def after_call(self, response, case):  # type: ignore[no-untyped-def]
            label = f"{case.operation.method.upper()} {case.operation.path}"
            calls.append((label, response.status_code))
            if response.status_code >= 500:
                server_errors.append(f"{label} -> {response.status_code}: {response.text[:300]}\n  "
                                     f"{case.as_curl_command()}")

        def validate_response(self, response, case, **kwargs):  # type: ignore[no-untyped-def]
            pass  # the property under test is "no 5xx", gathered in after_call over the whole run

    Machine.run(settings=settings(max_examples=STATEFUL_SCENARIOS, stateful_step_count=STATEFUL_STEPS,
                                  deadline=None, database=None, derandomize=False,
                                  suppress_health_check=list(HealthCheck)))
    by_op: dict[str, list[int]] = {}
    for label, status in calls:
        by_op.setdefault(label, []).append(status)
    print(f"schemathesis stateful: {len(calls)} requests over {len(by_op)} operations, {len(server_errors)} 5xx")
    for label, statuses in sorted(by_op.items()):
        print(f"  {len(statuses):5d}  {label}  ({statuses.count(200)} x 200)")
    # Random job ids are 404s: 200s on the job's own reads mean the state machine followed the links.
    followed = sum(by_op.get(f"GET /api/v1/jobs/{{job_id}}{suffix}", []).count(200)
                   for suffix in ("", "/report", "/timeseries", "/steps", "/rightsizing"))
    # The IngestStep link was followed; whether one of its few calls drew positive data is up to hypothesis (the
    # run is not derandomized), so the link's body is checked once more on the seeded job, deterministically.
    assert followed > 0 and by_op.get("POST /api/v1/ingest/events"), by_op
    body = {**INGEST_STEP_LINK["requestBody"], "source_id": "fuzz-stateful-check"}
    body["events"] = [{**body["events"][0], "job_id": JOB}]
    assert httpx.post(live_server + "/api/v1/ingest/events", json=body, headers=headers, timeout=60).status_code == 200
    assert server_errors == [], "\n".join(server_errors[:30])
