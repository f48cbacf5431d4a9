"""OpenAPI states the contract: every 2xx answer has a schema, the report's names every key PRODUCT.md lists, and
a live report (a real server, a replayed nvidia-smi capture and an uploaded Kineto trace) validates against it."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import pytest

from fleetprof.report import JobReport
from server.app import create_app
from server.config import ServerSettings

from .helpers import auth

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def openapi() -> dict[str, Any]:
    # Building the schema touches no database.
    return create_app(ServerSettings(database_url="postgresql+psycopg2://nobody@127.0.0.1:1/none")).openapi()


def _untyped(schema: dict[str, Any]) -> bool:
    """No schema, or an object that says nothing of its keys (what `-> dict[str, Any]` gives)."""
    return not schema or (schema.get("type") == "object" and "properties" not in schema and "$ref" not in schema
                          and schema.get("additionalProperties", True) is True)


def test_every_2xx_answer_has_a_schema(openapi):
    missing = []
    for path, ops in openapi["paths"].items():
        for method, op in ops.items():
            for code, answer in op["responses"].items():
                if not code.startswith("2") or code == "204":
                    continue
                content = answer.get("content") or {}
                if not content or any(_untyped(c.get("schema") or {}) for c in content.values()):
                    missing.append(f"{method.upper()} {path} {code}")
    assert not missing, missing


def _resolve(doc: dict[str, Any], schema: dict[str, Any]) -> dict[str, Any]:
    """The object schema behind refs, nullable unions and arrays."""
    while True:
        if "$ref" in schema:
            schema = doc["components"]["schemas"][schema["$ref"].rsplit("/", 1)[1]]
        elif "anyOf" in schema:
            schema = next(s for s in schema["anyOf"] if s.get("type") != "null")
        elif schema.get("type") == "array":
            schema = schema["items"]
        else:
            return schema


def _product_keys() -> list[list[str]]:
    """Every key path PRODUCT.md lists for the report, e.g. ["gpus", "uuid"], ["time", "step_time_s", "p95"]."""
    text = (ROOT / "docs/PRODUCT.md").read_text()
    para = text[text.index("Report JSON keys the clients rely on"):text.index("A value that cannot be known")]
    para = re.sub(r"\([^()]*\)", "", para)  # prose in parentheses
    paths: list[list[str]] = []
    for chunk in re.findall(r"`([^`]+)`", para):
        stack: list[str] = []
        for token in re.findall(r"[\w.]+|[{},]", chunk.replace("[]", "")):
            if token == "{":
                stack.append(paths[-1][-1])
            elif token == "}":
                stack.pop()
            elif token != ",":
                paths.append([*stack, *token.split(".")])
    return paths


def test_report_schema_names_every_product_key(openapi):
    op = openapi["paths"]["/api/v1/jobs/{job_id}/report"]["get"]
    report = op["responses"]["200"]["content"]["application/json"]["schema"]
    keys = _product_keys()
    assert len(keys) > 40 and ["health", "findings", "gpu_uuid"] in keys and ["time", "stragglers"] in keys
    for path in keys:
        schema = _resolve(openapi, report)
        for name in path:
            assert name in schema.get("properties", {}), f"report schema lacks {'.'.join(path)}"
            schema = _resolve(openapi, schema["properties"][name])


def _fleetprof(args: list[str], env: dict[str, str]) -> None:
    r = subprocess.run([sys.executable, "-m", "fleetprof.cli", *args], env=env, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr


def test_live_report_validates_against_the_openapi_schema(cli_env, live_server, make_token, real_data, openapi):
    env = {**cli_env, "FLEETPROF_SERVER_URL": live_server, "FLEETPROF_TOKEN": make_token("operator")}
    capture = real_data / "nvidia-smi/linux-x86_64__nvidia-h100-80gb-hbm3__590.48.01.txt"
    _fleetprof(["replay", str(capture), "--job-id", "typed-1", "--node", "node-typed"], env)
    _fleetprof(["import-trace", "typed-1", str(real_data / "kineto/hta/trace_filter/sampled_rank-0.json.gz")], env)
    report = httpx.get(f"{live_server}/api/v1/jobs/typed-1/report?refresh=true", headers=auth(env["FLEETPROF_TOKEN"]),
                       timeout=60).json()
    assert report["traces"]["kineto_files"] == 1 and report["time"]["breakdown"] is not None
    schema = {**openapi["paths"]["/api/v1/jobs/{job_id}/report"]["get"]["responses"]["200"]["content"]
              ["application/json"]["schema"], "components": openapi["components"]}
    jsonschema.validate(report, schema, cls=jsonschema.Draft202012Validator)
    typed = JobReport.model_validate(report)
    # Routes that send a prepared body (not checked by FastAPI on the way out) match their schema too.
    for path, params in (("/api/v1/jobs/{job_id}/steps", {}), ("/api/v1/jobs/{job_id}/steps", {"points": 50}),
                         ("/api/v1/jobs/{job_id}/rightsizing", {}), ("/api/v1/fleet/timeline", {"window": "400d"}),
                         ("/api/v1/fleet/summary", {"window": "400d"}), ("/readyz", {})):
        r = httpx.get(live_server + path.replace("{job_id}", "typed-1"), params=params, timeout=60,
                      headers=auth(env["FLEETPROF_TOKEN"]))
        assert r.status_code == 200, (path, r.text)
        answer = {**openapi["paths"][path]["get"]["responses"]["200"]["content"]["application/json"]["schema"],
                  "components": openapi["components"]}
        jsonschema.validate(r.json(), answer, cls=jsonschema.Draft202012Validator)
    assert typed.memory.peak_used_bytes == report["memory"]["peak_used_bytes"]
    # The schema is strict where the report is closed: an unknown key in a section is refused.
    bad = {**report, "memory": {**report["memory"], "peak_used_mib": 1}}
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad, schema, cls=jsonschema.Draft202012Validator)
