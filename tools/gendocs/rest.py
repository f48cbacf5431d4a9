"""docs/rest.md from the app's OpenAPI document (`server.app:create_app().openapi()`): every operation with its
parameters, body and responses, then every schema with its fields. Building the app opens no database: engines
are made in the lifespan, which this never enters."""

from __future__ import annotations

import json
from typing import Any

from tools.gendocs.markdown import cell, code, generated_banner, slug, table

Schema = dict[str, Any]
_METHODS = ("get", "post", "put", "patch", "delete")


def _ref_name(ref: str) -> str:
    return ref.rsplit("/", 1)[-1]


def type_text(schema: Schema) -> str:
    """A schema as a short type: `JobRead` (linked), `list[str]`, `int | null`, `"json" | "html"`."""
    if "$ref" in schema:
        name = _ref_name(schema["$ref"])
        return f"[{name}](#{slug(name)})"
    if "enum" in schema:
        return " | ".join(code(json.dumps(v)) for v in schema["enum"])
    if "const" in schema:
        return code(json.dumps(schema["const"]))
    for key in ("anyOf", "oneOf", "allOf"):
        if key in schema:
            return " | ".join(type_text(s) for s in schema[key])
    kind = schema.get("type")
    if kind == "array":
        return f"list[{type_text(schema.get('items', {}))}]"
    if kind == "object":
        extra = schema.get("additionalProperties")
        return f"dict[str, {type_text(extra)}]" if isinstance(extra, dict) and extra else "object"
    if kind is None:
        return "any"
    return {"integer": "int", "number": "float", "string": "str", "boolean": "bool", "null": "null"}.get(
        str(kind), str(kind)) + (f" ({schema['format']})" if "format" in schema else "")


_BOUNDS = (("minimum", "≥ {}"), ("exclusiveMinimum", "> {}"), ("maximum", "≤ {}"), ("exclusiveMaximum", "< {}"),
           ("minLength", "length ≥ {}"), ("maxLength", "length ≤ {}"), ("minItems", "≥ {} items"),
           ("maxItems", "≤ {} items"), ("pattern", "pattern `{}`"))


def _number(value: Any) -> Any:
    """1.0 -> 1: pydantic writes integer bounds of some fields as floats."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


def constraints(schema: Schema) -> str:
    parts = [fmt.format(_number(schema[k])) for k, fmt in _BOUNDS if k in schema]
    for sub in schema.get("anyOf", []):
        parts += [fmt.format(_number(sub[k])) for k, fmt in _BOUNDS if k in sub]
    if "default" in schema and schema["default"] is not None:
        parts.append("default " + code(json.dumps(schema["default"])))
    return ", ".join(parts)


def _operation(path: str, method: str, op: Schema) -> list[str]:
    title = f"{method.upper()} {path}"
    lines = [f"### {title}", "", op.get("summary", "")]
    if op.get("description"):
        lines += ["", op["description"].strip()]
    params = op.get("parameters", [])
    lines += ["", "Auth: `Authorization: Bearer <token>`." if op.get("security") else "Auth: none.",
              "", f"operationId: {code(op.get('operationId', ''))}."]
    rows = [(code(p["name"]), p["in"], type_text(p.get("schema", {})), "yes" if p.get("required") else "",
             "; ".join(x for x in (p.get("description", ""), constraints(p.get("schema", {}))) if x))
            for p in params]
    if rows:
        lines += ["", table(("parameter", "in", "type", "required", "notes"), rows)]
    body = op.get("requestBody")
    if body:
        kinds = [f"{code(ct)}: {type_text(c.get('schema', {}))}" for ct, c in body.get("content", {}).items()]
        lines += ["", "Body" + (" (required)" if body.get("required") else "") + ": " + "; ".join(kinds) + "."]
    responses = []
    for status, resp in op.get("responses", {}).items():
        content = resp.get("content", {})
        kinds = [f"{code(ct)} {type_text(c['schema'])}" if c.get("schema") else code(ct) for ct, c in content.items()]
        responses.append((code(status), resp.get("description", ""), "; ".join(kinds)))
    lines += ["", table(("status", "meaning", "body"), responses)]
    return lines


def _schema(name: str, schema: Schema) -> list[str]:
    lines = [f"### {name}"]
    if schema.get("description"):
        lines += ["", cell(schema["description"])]
    props = schema.get("properties", {})
    required = set(schema.get("required", []))
    if props:
        rows = [(code(f), type_text(s), "yes" if f in required else "",
                 "; ".join(x for x in (s.get("description", ""), constraints(s)) if x)) for f, s in props.items()]
        lines += ["", table(("field", "type", "required", "notes"), rows)]
    elif "enum" in schema:
        lines += ["", "One of " + type_text(schema) + "."]
    return lines


def render_spec(spec: Schema) -> str:
    info = spec.get("info", {})
    ops = [(path, m, item[m]) for path, item in spec["paths"].items() for m in _METHODS if m in item]
    parts = [
        generated_banner("the OpenAPI document of `server.app:create_app`"),
        "",
        "# REST reference",
        "",
        f"{info.get('title', '')} {info.get('version', '')}. {' '.join(info.get('description', '').split())}",
        "",
        "A running collector serves the same document at `/openapi.json` and an explorer at `/docs`. Who may "
        "call what (token scopes `agent`, `team:<name>`, `scheduler`, `operator`) is in "
        "[guide-operators.md](guide-operators.md#tokens); a token that may not see a job gets 404, as if the job "
        "did not exist. Every number carries its unit in its name; what cannot be known is `null`.",
        "",
        "Conventions: the token is the `bearer` security scheme (`/docs` has an Authorize button). Each operation's "
        "`operationId` is `<tag>-<function>` (`jobs-get_report`), stable and unique, for generated clients. Every "
        "error (4xx, 5xx) is an RFC 9457 problem ([Problem](#problem), `application/problem+json`): `type` "
        "(`urn:fleetprof:problem:<kind>`: `unauthenticated`, `forbidden`, `not-found`, `validation-error`, "
        "`invalid-input`, `payload-too-large`, `rate-limited`, `overloaded`, `database-unavailable`, ...), `title`, "
        "`status`, `detail` (a sentence; for request validation the list of issues, also in `errors`), and "
        "`retry_after_s` beside a `Retry-After` header (429, 503). Request bodies may be sent "
        "`Content-Encoding: gzip` on every route (at most `FLEETPROF_MAX_DECOMPRESSED_BYTES` once inflated, else "
        "413; another encoding is 415).",
        "",
        "## Endpoints",
        "",
        table(("method", "path", "what"),
              [(code(m.upper()), f"[{code(p)}](#{slug(f'{m.upper()} {p}')})", op.get("summary", ""))
               for p, m, op in ops]),
    ]
    for path, method, op in ops:
        parts += ["", *_operation(path, method, op)]
    parts += ["", "## Schemas"]
    for name, schema in spec.get("components", {}).get("schemas", {}).items():
        parts += ["", *_schema(name, schema)]
    return "\n".join(parts) + "\n"


def render() -> str:
    from server.app import create_app

    return render_spec(create_app().openapi())
