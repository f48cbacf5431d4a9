"""Scopes and team isolation: every endpoint of the OpenAPI document × every kind of caller.

The endpoints are read from `app.openapi()`, so a new route is exercised here the day it is added. Its access rule
must then be written in ACCESS below (PRODUCT.md's "who" column); until it is, the test fails and says so.
Expected: missing or bad token → 401; a scope the route does not admit → 403; another team's job → 404, and no
response to a caller ever carries data of a team it does not belong to. Issue 15: an agent token writes only for
its node (samples naming another node → 403; a job of another node → 404, as if it did not exist); GPUs are
attached to a job by their node's agent or an operator, or by a team where the agent attributed them to the team;
only agents and operators create nodes and GPUs.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import pytest

from fleetprof.protocol import PROTOCOL_VERSION
from tests.server.helpers import auth, sample_batch

SCOPES = ("none", "bad", "agent", "team_a", "team_b", "scheduler", "operator")
TEAM_OF = {"team_a": "alpha", "team_b": "beta"}
JOB_OF = {"alpha": "job-alpha", "beta": "job-beta"}
RERUN_OF = {"alpha": "job-alpha-2", "beta": "job-beta-2"}  # a second run per team, for GET /jobs/compare
# Strings that exist only in one team's job: a response to the other team carrying one is a leak.
MARKER = {"alpha": "alpha-confidential-7f3a", "beta": "beta-confidential-c91e"}
NODE, OTHER_NODE = "node-x", "node-y"
GPU_OF = {"alpha": f"GPU-{NODE}-0", "beta": f"GPU-{NODE}-1"}  # attributed to the team's job by NODE's agent
SHARED_FINGERPRINT = "ab" * 10  # both teams' jobs train the same model (framework_info events)
OTHER_NODE_JOB = "job-beta-y"  # beta's job on OTHER_NODE, whose GPU-node-y-0 that node's agent attributed to it

PUBLIC = "public"           # anyone, token or not
JOB_READ = ("team", "scheduler", "operator")


# each team's seeded trace id (the `seeded` fixture fills it; the download route is read through it)
TRACE_OF: dict[str, int] = {}


@dataclass(frozen=True)
class Rule:
    """Who may call an endpoint. `scopes`: admitted scopes (operator is always admitted unless the route is
    public). `team_bound`: a team token may act only on its own team's job (else 404)."""

    scopes: tuple[str, ...] | str
    team_bound: bool = False
    node_bound: bool = False  # an agent token writes only for its node (else 403; a job of another node: 404)


# PRODUCT.md, "REST contract v1", the "who" column (and the dashboard's extra read routes).
ACCESS: dict[tuple[str, str], Rule] = {
    ("GET", "/healthz"): Rule(PUBLIC),
    ("GET", "/readyz"): Rule(PUBLIC),
    ("GET", "/healthz/broker"): Rule(PUBLIC),
    ("GET", "/metrics/fleet"): Rule(PUBLIC),
    ("GET", "/metrics"): Rule(PUBLIC),
    ("POST", "/api/v1/ingest/samples"): Rule(("agent",), node_bound=True),
    ("POST", "/api/v1/ingest/events"): Rule(("agent", "team"), team_bound=True, node_bound=True),
    ("POST", "/api/v1/jobs"): Rule(("team", "agent"), team_bound=True, node_bound=True),
    ("GET", "/api/v1/jobs"): Rule(JOB_READ),
    ("GET", "/api/v1/jobs/compare"): Rule(JOB_READ, team_bound=True),
    ("GET", "/api/v1/jobs/characterization"): Rule(JOB_READ, team_bound=True),
    ("GET", "/api/v1/jobs/{job_id}"): Rule(JOB_READ, team_bound=True),
    ("GET", "/api/v1/jobs/{job_id}/report"): Rule(JOB_READ, team_bound=True),
    ("GET", "/api/v1/jobs/{job_id}/timeseries"): Rule(JOB_READ, team_bound=True),
    ("GET", "/api/v1/jobs/{job_id}/timeseries/batch"): Rule(JOB_READ, team_bound=True),
    ("GET", "/api/v1/jobs/{job_id}/rightsizing"): Rule(JOB_READ, team_bound=True),
    ("GET", "/api/v1/rightsizing"): Rule(JOB_READ, team_bound=True),
    ("GET", "/api/v1/jobs/{job_id}/projection"): Rule(JOB_READ, team_bound=True),
    ("GET", "/api/v1/jobs/{job_id}/steps"): Rule(JOB_READ, team_bound=True),
    ("GET", "/api/v1/jobs/{job_id}/plans/offsets"): Rule(JOB_READ, team_bound=True),
    ("GET", "/api/v1/jobs/{job_id}/plans/swap"): Rule(JOB_READ, team_bound=True),
    ("POST", "/api/v1/jobs/{job_id}/traces"): Rule(("team", "agent"), team_bound=True, node_bound=True),
    ("GET", "/api/v1/jobs/{job_id}/traces"): Rule(JOB_READ, team_bound=True),
    ("GET", "/api/v1/jobs/{job_id}/traces/{trace_id}"): Rule(JOB_READ, team_bound=True),
    ("POST", "/api/v1/jobs/{job_id}/captures"): Rule(("team",), team_bound=True),
    ("GET", "/api/v1/jobs/{job_id}/captures"): Rule(("team",), team_bound=True),
    ("POST", "/api/v1/jobs/{job_id}/captures/{capture_id}/state"): Rule(("team",), team_bound=True),
    ("POST", "/api/v1/estimate"): Rule(("scheduler", "team")),
    ("GET", "/api/v1/fleet/summary"): Rule(()),
    ("GET", "/api/v1/fleet/rollups"): Rule(()),
    ("GET", "/api/v1/fleet/timeline"): Rule(()),
    ("GET", "/api/v1/fleet/headroom"): Rule(()),
    ("GET", "/api/v1/nodes"): Rule(()),
    ("GET", "/api/v1/gpus"): Rule(()),
    ("GET", "/api/v1/gpus/gpm"): Rule(()),
}

# Leaks this matrix knows of, each with an xfail test below that fails the day it is fixed (strict).
KNOWN_GAPS: set[tuple[str, str, str]] = set()

# A tiny but real Kineto trace (one kernel, two 2 MiB blocks allocated and freed: a memory plan), identical bytes
# every time: re-uploads are idempotent no-ops.
KINETO = (b'{"schemaVersion": 1, "deviceProperties": [], "traceEvents": [{"ph": "X", "cat": "kernel", '
          b'"name": "k", "pid": 0, "tid": 7, "ts": 1000, "dur": 50, "args": {"device": 0, "stream": 7}}'
          + b"".join(b', {"ph": "i", "name": "[memory]", "pid": 0, "tid": 7, "ts": %d, "args": {"Device Type": 1, '
                     b'"Device Id": 0, "Addr": %d, "Bytes": %d, "Total Allocated": %d, "Total Reserved": 8388608}}'
                     % ev for ev in ((1000, 1 << 30, 2 << 20, 2 << 20), (1010, (1 << 30) + (2 << 20), 2 << 20, 4 << 20),
                                     (1020, 1 << 30, -(2 << 20), 2 << 20), (1040, (1 << 30) + (2 << 20), -(2 << 20), 0)))
          + b"]}")


@dataclass
class Call:
    method: str
    path: str
    params: dict[str, Any] = field(default_factory=dict)
    json: Any = None
    content: bytes | None = None
    job_team: str | None = None   # the team whose job the call targets
    node: str | None = None       # the node the call writes for
    expect: dict[str, int] | None = None  # per admitted scope, where the rules above do not say it all


def _calls(method: str, template: str, seq: list[int]) -> list[Call]:
    """The requests made for one operation: one per target job (own team / other team) or node."""
    now = time.time()
    out: list[Call] = []
    teams = ("alpha", "beta")
    if template == "/api/v1/ingest/samples":
        for node in (NODE, OTHER_NODE):
            seq[0] += 1
            out.append(Call(method, template, json=sample_batch(node=node, agent_id=f"m-{node}", seq=seq[0], n=2,
                                                                 t0=now - 60), node=node))
    elif template == "/api/v1/ingest/events":
        for team, job_id, node in (("alpha", JOB_OF["alpha"], NODE), ("beta", JOB_OF["beta"], NODE),
                                   ("beta", OTHER_NODE_JOB, OTHER_NODE)):
            seq[0] += 1
            out.append(Call(method, template, job_team=team, node=node, json={
                "protocol_version": PROTOCOL_VERSION, "source_id": "matrix", "seq": seq[0], "sent_at": now,
                "events": [{"kind": "step", "job_id": job_id, "ts": now - 30, "step": seq[0], "wall_s": 0.1}]}))
    elif (method, template) == ("POST", "/api/v1/jobs"):
        for team in teams:
            out.append(Call(method, template, job_team=team, node=NODE,
                            json={"job_id": JOB_OF[team], "framework": "pytorch"}))
        out.append(Call(method, template, job_team="beta", node=OTHER_NODE,
                        json={"job_id": OTHER_NODE_JOB, "framework": "pytorch"}))
        # Attaching GPUs (to the reruns, so that what an operator attaches leaves the jobs read above alone).
        own, foreign = {"job_id": RERUN_OF["alpha"], "node": NODE, "gpu_uuids": [GPU_OF["alpha"]]}, \
            {"job_id": RERUN_OF["alpha"], "node": OTHER_NODE, "gpu_uuids": [f"GPU-{OTHER_NODE}-0"]}
        out.append(Call(method, template, job_team="alpha", json=own,
                        expect={"agent": 200, "team_a": 200, "team_b": 404, "operator": 200}))
        # beta's GPU on another node: not alpha's to attach, nor NODE's agent's
        out.append(Call(method, template, job_team="alpha", json=foreign,
                        expect={"agent": 403, "team_a": 403, "team_b": 404, "operator": 200}))
        # a node and GPU no agent reported: only an operator creates them
        out.append(Call(method, template, job_team="alpha", json={
            "job_id": RERUN_OF["alpha"], "node": "node-phantom", "gpu_uuids": ["GPU-node-phantom-0"]},
            expect={"agent": 403, "team_a": 403, "team_b": 404, "operator": 200}))
    elif (method, template) == ("GET", "/api/v1/jobs"):
        out.append(Call(method, template))
        out.append(Call(method, template, params={"team": "beta"}))
        out.append(Call(method, template, params={"team": "alpha"}))
        out.append(Call(method, template, params={"fingerprint": SHARED_FINGERPRINT}))
    elif template == "/api/v1/rightsizing":  # by recurring job name: the teams' jobs are named by their MARKER
        for team in teams:
            out.append(Call(method, template, params={"name": MARKER[team], "team": team}, job_team=team))
    elif template == "/api/v1/gpus/gpm":  # a node's GPUs' recent GPM means: operators only
        out.append(Call(method, template, params={"node": NODE}))
    elif template == "/api/v1/jobs/compare":
        for team in teams:
            out.append(Call(method, template, params={"ids": f"{JOB_OF[team]},{RERUN_OF[team]}"}, job_team=team))
    elif template == "/api/v1/jobs/characterization":
        for team in teams:
            out.append(Call(method, template, params={"ids": f"{JOB_OF[team]},{RERUN_OF[team]}"}, job_team=team))
        # both teams' jobs share the fingerprint (seeded): each team reads its own runs only
        out.append(Call(method, template, params={"fingerprint": SHARED_FINGERPRINT}))
    elif template.endswith("/traces/{trace_id}"):  # each team's uploaded trace, read through its own job
        for team in teams:
            path = template.replace("{job_id}", JOB_OF[team]).replace("{trace_id}", str(TRACE_OF[team]))
            out.append(Call(method, path, params={"format": "original"}, job_team=team))
    elif "{job_id}" in template:
        if method == "POST" and template.endswith("/traces"):
            out.append(Call(method, template.replace("{job_id}", OTHER_NODE_JOB), content=KINETO, job_team="beta",
                            node=OTHER_NODE, params={"filename": "t.json"}))
        for team in teams:
            path = template.replace("{job_id}", JOB_OF[team])
            if method == "POST" and template.endswith("/traces"):
                out.append(Call(method, path, content=KINETO, job_team=team, node=NODE, params={"filename": "t.json"}))
            elif (method, template) == ("POST", "/api/v1/jobs/{job_id}/captures"):
                out.append(Call(method, path, json={"kind": "kineto", "steps": 3}, job_team=team,
                                expect={"team_a": 202, "team_b": 202, "operator": 202}))
            elif template.endswith("/captures/{capture_id}/state"):  # a capture id nobody issued: admitted, 404
                out.append(Call(method, path.replace("{capture_id}", "0" * 32), json={"state": "delivered"},
                                job_team=team, expect={"team_a": 404, "team_b": 404, "operator": 404}))
            elif template.endswith("/projection"):
                out.append(Call(method, path, params={"gpu": "L40S"}, job_team=team))
            elif template.endswith(("/timeseries", "/timeseries/batch")):
                out.append(Call(method, path, params={"metric": "memory_used_bytes"}, job_team=team))
            else:
                out.append(Call(method, path, job_team=team))
    elif method == "POST":
        out.append(Call(method, template, json={}))  # a route whose body this test does not build
    else:
        out.append(Call(method, template))
    return out


def _expected(rule: Rule, scope: str, call: Call) -> set[int]:
    if rule.scopes == PUBLIC:
        return {200}
    if scope in ("none", "bad"):
        return {401}
    kind = "team" if scope.startswith("team") else scope
    if kind != "operator" and kind not in rule.scopes:
        return {403}
    if kind == "team" and rule.team_bound and call.job_team not in (None, TEAM_OF[scope]):
        return {404}
    if kind == "agent" and rule.node_bound and call.node not in (None, NODE):
        return {404} if call.job_team else {403}  # another node's job is as if it did not exist
    if call.expect is not None and scope in call.expect:
        return {call.expect[scope]}
    if call.method == "POST" and call.json == {}:
        return {200, 422}  # admitted; the empty body this test sends may be refused as invalid
    return {200}


@pytest.fixture
def seeded(api, make_token):
    """Two teams' jobs on a node with telemetry, traces and steps; one token of every kind."""
    tokens = {"agent": make_token("agent", node=NODE), "team_a": make_token("team", team="alpha"),
              "team_b": make_token("team", team="beta"), "scheduler": make_token("scheduler"),
              "operator": make_token("operator")}
    now = time.time()
    # The teams register their jobs before they run, as `fleetprof run` does: a job an agent saw first is no
    # team's to claim, only an operator's or its node's agent's to assign (server.auth.policy.may_write_job).
    for scope, team, job_id in (*((s, t, JOB_OF[t]) for s, t in TEAM_OF.items()), ("team_b", "beta", OTHER_NODE_JOB)):
        r = api.post("/api/v1/jobs", headers=auth(tokens[scope]), json={"job_id": job_id, "team": team})
        assert r.status_code == 200, r.text
    # Each team's job on a GPU of its own, attributed by the node's agent (the processes' FLEETPROF_JOB_ID);
    # beta's job on the other node too.
    for node, agent, jobs in ((NODE, tokens["agent"], {GPU_OF[t]: JOB_OF[t] for t in JOB_OF}),
                              (OTHER_NODE, make_token("agent", node=OTHER_NODE),
                               {f"GPU-{OTHER_NODE}-0": OTHER_NODE_JOB})):
        batch = sample_batch(node=node, agent_id=f"seed-{node}", n=20, t0=now - 120, gpus=len(jobs))
        cols = batch["samples"]
        batch["processes"] = {"ts": cols["ts"], "gpu_uuid": cols["gpu_uuid"], "pid": [7] * len(cols["ts"]),
                              "used_memory_bytes": [2**30] * len(cols["ts"]),
                              "job_id": [jobs[u] for u in cols["gpu_uuid"]]}
        r = api.post("/api/v1/ingest/samples", json=batch, headers=auth(agent))
        assert r.status_code == 200, r.text
    r = api.post("/api/v1/jobs", headers=auth(tokens["team_b"]), json={
        "job_id": OTHER_NODE_JOB, "team": "beta", "node": OTHER_NODE, "gpu_uuids": [f"GPU-{OTHER_NODE}-0"],
        "state": "running", "started_at": now - 120})
    assert r.status_code == 200, r.text
    for scope, team in TEAM_OF.items():
        r = api.post("/api/v1/jobs", headers=auth(tokens[scope]), json={
            "job_id": JOB_OF[team], "team": team, "name": MARKER[team], "command": f"python {MARKER[team]}.py",
            "node": NODE, "gpu_uuids": [GPU_OF[team]], "state": "running",
            "started_at": now - 120, "metadata": {"secret": MARKER[team]}})
        assert r.status_code == 200, r.text
        r = api.post(f"/api/v1/jobs/{JOB_OF[team]}/traces", content=KINETO, headers=auth(tokens[scope]))
        assert r.status_code == 200, r.text
        listed = api.get(f"/api/v1/jobs/{JOB_OF[team]}/traces", headers=auth(tokens[scope]))
        assert listed.status_code == 200, listed.text
        TRACE_OF[team] = listed.json()["traces"][0]["trace_id"]
        r = api.post("/api/v1/ingest/events", headers=auth(tokens[scope]), json={
            "protocol_version": PROTOCOL_VERSION, "source_id": f"seed-{team}", "seq": 1, "sent_at": now, "events": [
                {"kind": "framework_info", "job_id": JOB_OF[team], "ts": now - 60, "fingerprint": SHARED_FINGERPRINT,
                 "model_class": f"m.{MARKER[team]}"}]})
        assert r.status_code == 200, r.text
        r = api.post("/api/v1/jobs", headers=auth(tokens[scope]), json={
            "job_id": RERUN_OF[team], "team": team, "name": MARKER[team], "node": NODE, "state": "finished",
            "gpu_uuids": [GPU_OF[team]], "started_at": now - 120, "ended_at": now - 60})
        assert r.status_code == 200, r.text
    tokens["bad"] = "fp_" + "x" * 43
    return tokens


def test_every_endpoint_under_every_scope(api, seeded):
    spec = api.app.openapi()
    unclassified, wrong = [], []
    cases = 0
    seq = [1000]
    for template, ops in spec["paths"].items():
        for method in ops:
            method = method.upper()
            rule = ACCESS.get((method, template))
            for scope in SCOPES:
                headers = {} if scope == "none" else auth(seeded[scope])
                for call in _calls(method, template, seq):
                    r = api.request(call.method, call.path, params=call.params, json=call.json,
                                    content=call.content, headers=headers)
                    cases += 1
                    if rule is None:
                        if scope in ("none", "bad") and r.status_code != 401:
                            wrong.append(f"{method} {call.path} [{scope}] -> {r.status_code}, expected 401")
                        continue
                    expected = _expected(rule, scope, call)
                    if r.status_code not in expected:
                        wrong.append(f"{method} {call.path} {call.params or ''} [{scope}] -> {r.status_code}, "
                                     f"expected {sorted(expected)}: {r.text[:200]}")
                    # Never data: a denied answer carries no job data, a team sees nothing of the other team.
                    foreign = [m for t, m in MARKER.items() if scope in ("none", "bad", "agent") or
                               (scope in TEAM_OF and TEAM_OF[scope] != t)]
                    if (scope, method, template) in KNOWN_GAPS:
                        foreign = []
                    leaked = [m for m in foreign if m in r.text]
                    if r.status_code >= 400 and (MARKER["alpha"] in r.text or MARKER["beta"] in r.text):
                        leaked.append("job data in a refusal")
                    if leaked:
                        wrong.append(f"{method} {call.path} {call.params or ''} [{scope}] leaked {leaked}")
            if rule is None:
                unclassified.append(f"{method} {template}")
    print(f"access matrix: {len(spec['paths'])} paths, {cases} requests over {len(SCOPES)} scopes")
    assert not wrong, "\n".join(wrong)
    assert not unclassified, ("endpoints with no access rule in tests/security/test_access_matrix.py ACCESS "
                              f"(add their PRODUCT.md 'who'): {unclassified}")
    assert cases >= 7 * 14


def test_team_listing_shows_only_its_own_jobs(api, seeded):
    for scope, team in TEAM_OF.items():
        for params in ({}, {"team": "alpha"}, {"team": "beta"}, {"q": "job"}):
            body = api.get("/api/v1/jobs", params=params, headers=auth(seeded[scope])).json()
            assert {j["team"] for j in body["items"]} <= {team}, (scope, params, body)
            assert body["total"] == len(body["items"])
    both = api.get("/api/v1/jobs", headers=auth(seeded["scheduler"])).json()
    assert {j["job_id"] for j in both["items"]} == set(JOB_OF.values()) | set(RERUN_OF.values()) | {OTHER_NODE_JOB}


def test_an_agent_cannot_move_a_job_to_another_team(api, seeded):
    # Was a hole: POST /api/v1/jobs with an agent token set `team` on any job, handing it to another team.
    r = api.post("/api/v1/jobs", json={"job_id": JOB_OF["alpha"], "team": "beta"}, headers=auth(seeded["agent"]))
    assert r.status_code == 403
    assert api.get(f"/api/v1/jobs/{JOB_OF['alpha']}", headers=auth(seeded["team_b"])).status_code == 404
    assert api.get(f"/api/v1/jobs/{JOB_OF['alpha']}", headers=auth(seeded["team_a"])).status_code == 200
    r = api.post("/api/v1/jobs", json={"job_id": JOB_OF["alpha"], "team": "beta"}, headers=auth(seeded["operator"]))
    assert r.status_code == 200 and r.json()["team"] == "beta"  # an operator may


def test_an_agent_cannot_read_a_job_through_registration(api, seeded):
    r = api.post("/api/v1/jobs", json={"job_id": JOB_OF["alpha"]}, headers=auth(seeded["agent"]))
    assert MARKER["alpha"] not in r.text
