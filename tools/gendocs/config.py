"""docs/configuration.md from the pydantic-settings classes: variable, type, default, meaning.

The meaning is the field's `description` where it has one, else the comments written beside it in the class
(the comment lines right above the field and the one at the end of its line), so a setting is documented
where it is defined and the reference cannot drift from it.
"""

from __future__ import annotations

import ast
import inspect
import io
import tokenize
from pathlib import Path
from typing import Any

from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined
from pydantic_settings import BaseSettings

from tools.gendocs.markdown import code, generated_banner, table

# (title, settings class path, who reads it)
DEPLOYABLES: tuple[tuple[str, str, str], ...] = (
    ("Server", "server.config:ServerSettings",
     "the collector and REST API (`fleetprof server`, `fleetprof up`), Celery workers (`fleetprof worker`), "
     "`fleetprof db` and `fleetprof token`"),
    ("Client commands and the SDK", "fleetprof.settings:ClientSettings",
     "the client commands (`report`, `rightsizing`, `replay`, `import-trace`, `estimate`) and "
     "`fleetprof.client.Client.from_settings()`"),
    ("Agent", "agent.config:AgentSettings",
     "the node agent (`fleetprof agent`), `fleetprof run` and its framework hooks, and `fleetprof slurm`"),
    ("Dashboard", "dashboard.config:DashboardSettings", "the Dash dashboard (`fleetprof dashboard`)"),
)


def _load(path: str) -> type[BaseSettings]:
    module_name, _, name = path.partition(":")
    module = __import__(module_name, fromlist=[name])
    cls: type[BaseSettings] = getattr(module, name)
    return cls


def field_comments(cls: type) -> dict[str, str]:
    """Comments beside each annotated field of `cls`: the comment-only lines right above it, then its own."""
    source_file = inspect.getsourcefile(cls)
    assert source_file is not None
    text = Path(source_file).read_text()
    comments: dict[int, str] = {}
    code_lines: set[int] = set()
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        if tok.type == tokenize.COMMENT:
            comments[tok.start[0]] = tok.string.lstrip("#").strip()
        elif tok.type not in (tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT, tokenize.ENDMARKER):
            code_lines.update(range(tok.start[0], tok.end[0] + 1))
    out: dict[str, str] = {}
    for node in ast.walk(ast.parse(text)):
        if not (isinstance(node, ast.ClassDef) and node.name == cls.__name__):
            continue
        for stmt in node.body:
            if not (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)):
                continue
            above: list[str] = []
            line = stmt.lineno - 1
            while line in comments and line not in code_lines:
                above.insert(0, comments[line])
                line -= 1
            own = [comments[n] for n in range(stmt.lineno, (stmt.end_lineno or stmt.lineno) + 1) if n in comments]
            out[stmt.target.id] = " ".join(above + own)
    return out


def env_name(cls: type[BaseSettings], name: str, field: FieldInfo) -> str:
    alias = field.validation_alias if isinstance(field.validation_alias, str) else field.alias
    prefix = str(cls.model_config.get("env_prefix", ""))
    return (alias or prefix + name).upper()


def _type_text(annotation: Any) -> str:
    text = annotation.__name__ if isinstance(annotation, type) else str(annotation)
    return text.replace("pathlib.", "").replace("typing.", "")


def default_text(name: str, field: FieldInfo) -> str:
    if field.default_factory is not None:
        value: Any = field.default_factory()  # type: ignore[call-arg]
    elif field.default is PydanticUndefined:
        return "required"
    else:
        value = field.default
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return code(str(value).lower())
    if name.endswith("_bytes") and isinstance(value, int) and value >= 1 << 20 and value % (1 << 20) == 0:
        return f"{code(value)} ({value >> 20} MiB)"
    if isinstance(value, Path):
        return code(value.as_posix())
    return code(value)


def render() -> str:
    parts = [
        generated_banner("the settings classes " + ", ".join(f"`{p}`" for _, p, _ in DEPLOYABLES)),
        "",
        "# Configuration",
        "",
        "Every setting comes from the environment, prefix `FLEETPROF_`, one settings class per deployable; nothing "
        "else reads the environment. Names are case-insensitive. A value that is *unset* means the feature's "
        "fallback described beside it. Units are in the names (`_s` seconds, `_bytes` bytes, `_w` watts).",
        "",
        "Where the same variable appears in two classes (`FLEETPROF_SERVER_URL`, `FLEETPROF_TOKEN`), each "
        "deployable reads it for itself. How to set them for a cluster: [deployment.md](deployment.md).",
    ]
    for title, path, readers in DEPLOYABLES:
        cls = _load(path)
        comments = field_comments(cls)
        rows = []
        for name, field in cls.model_fields.items():
            meaning = field.description or comments.get(name, "")
            rows.append((code(env_name(cls, name, field)), code(_type_text(field.annotation)),
                         default_text(name, field), meaning or "—"))
        parts += ["", f"## {title}", "", f"`{path}`, read by {readers}.", "",
                  table(("variable", "type", "default", "meaning"), rows)]
    return "\n".join(parts) + "\n"


def undocumented() -> list[str]:
    """Settings with neither a description nor a comment (the generator warns about them)."""
    missing = []
    for _, path, _ in DEPLOYABLES:
        cls = _load(path)
        comments = field_comments(cls)
        missing += [f"{path}.{n}" for n, f in cls.model_fields.items() if not (f.description or comments.get(n))]
    return missing
