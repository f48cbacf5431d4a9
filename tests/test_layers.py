"""Layering read from the source: `server.analysis` is pure and acyclic (modules and subpackages alike), `agent`
runs without `server`, `server` and `dashboard` without `agent`, and the bare `fleetprof` package (protocol, REST
client, formatting, client commands) without any of them. Only `embedded` (the composition roots) brings them
together.

Imports are read with `ast`, so an import inside a function counts like one at the top: a lazy import that dodges
a cycle at run time is still a cycle in the design. `if TYPE_CHECKING:` imports count too.
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Iterable, Iterator
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
PRODUCT = ("fleetprof", "agent", "server", "dashboard", "embedded")
# Pure analysis does no I/O: no database, web framework, HTTP client, broker or task queue.
IO_LIBRARIES = frozenset({"sqlalchemy", "fastapi", "starlette", "httpx", "redis", "celery", "psycopg2"})
# What each top-level package may not import, even lazily (fleetprof/cli.py names subcommand modules as strings,
# which is how `fleetprof up` and `fleetprof estimate` reach `embedded` without an import).
FORBIDDEN: dict[str, frozenset[str]] = {
    "fleetprof": frozenset({"server", "agent", "dashboard", "embedded"}),
    "agent": frozenset({"server", "dashboard", "embedded"}),
    "server": frozenset({"agent", "dashboard", "embedded"}),
    "dashboard": frozenset({"agent", "server", "embedded"}),
}


def _module_name(path: Path, root: Path) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path, module: str) -> Iterator[tuple[str, list[str]]]:
    """Every import in `path`: (module, names) with `from module import names`, (module, []) with `import`."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            yield from ((alias.name, []) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            yield base, [alias.name for alias in node.names]


def import_graph(root: Path = REPO_ROOT) -> dict[str, set[str]]:
    """Product module -> the modules it imports (product modules resolved to those that exist, others as named).

    `from pkg import sub` is an import of the submodule `pkg.sub` alone, as import-linter counts it."""
    files = {_module_name(p, root): p for top in PRODUCT for p in (root / top).rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for module, path in files.items():
        targets = set()
        for base, names in _imports(path, module):
            if base.split(".")[0] not in PRODUCT:
                targets.add(base)
                continue
            submodules = {f"{base}.{name}" for name in names} & files.keys()
            targets |= submodules
            if base in files and (not names or len(submodules) < len(names)):
                targets.add(base)
        graph[module] = targets - {module}
    return graph


@functools.cache
def product_graph() -> dict[str, set[str]]:
    """This repository's graph, read once per session (each read parses every product file)."""
    return import_graph()


def cycles(graph: dict[str, set[str]], nodes: Iterable[str]) -> list[list[str]]:
    """Strongly connected components of more than one module among `nodes` (Tarjan, iterative)."""
    keep = set(nodes)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in sorted(keep):
        if start in index:
            continue
        work = [(start, iter(sorted(graph.get(start, set()) & keep)))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
            elif child not in index:
                index[child] = low[child] = len(index)
                stack.append(child)
                on_stack.add(child)
                work.append((child, iter(sorted(graph.get(child, set()) & keep))))
            elif child in on_stack:
                low[node] = min(low[node], index[child])
    return found


def _under(graph: dict[str, set[str]], prefix: str) -> list[str]:
    return [m for m in graph if m == prefix or m.startswith(prefix + ".")]


def package_graph(graph: dict[str, set[str]], package: str) -> dict[str, set[str]]:
    """The imports among `package`'s direct children ("" for the top-level packages), each child standing for all
    the modules below it: a cycle here is a cycle between subpackages even when no two modules import each other."""
    prefix = f"{package}." if package else ""

    def child(module: str) -> str | None:
        if not module.startswith(prefix) or module == package:
            return None
        return prefix + module[len(prefix):].split(".")[0]

    out: dict[str, set[str]] = {}
    for module, targets in graph.items():
        if (source := child(module)) is None:
            continue
        out.setdefault(source, set()).update(t for t in map(child, targets) if t is not None and t != source)
    return out


def test_no_import_cycle_between_packages_anywhere() -> None:
    graph = product_graph()
    packages = {m.rpartition(".")[0] for m in graph} - {""}
    assert {p: c for p in sorted(packages) if (c := cycles(pg := package_graph(graph, p), pg))} == {}
    top = package_graph(graph, "")
    assert cycles(top, top) == []


def test_no_import_cycle_inside_analysis() -> None:
    graph = product_graph()
    assert cycles(graph, _under(graph, "server.analysis")) == []


def test_analysis_subpackages_form_no_cycle() -> None:
    # one concern per subpackage (memory, time, energy, planning, traces, fleet, base): a concern may use another
    # only one way round, or the split by concern means nothing
    graph = package_graph(product_graph(), "server.analysis")
    assert {"server.analysis.base", "server.analysis.planning", "server.analysis.traces"} <= graph.keys()
    assert cycles(graph, graph) == []
    assert graph["server.analysis.base"] == set()  # the shared base leans on no concern


def test_analysis_imports_no_io_even_indirectly() -> None:
    graph = product_graph()
    offenders = []
    for module in _under(graph, "server.analysis"):
        seen, todo = {module}, [module]
        while todo:  # through product modules only: what the analysis module pulls in when imported
            for target in graph.get(todo.pop(), set()):
                if target.split(".")[0] in IO_LIBRARIES:
                    offenders.append(f"{module} -> ... -> {target}")
                elif target in graph and target not in seen:
                    seen.add(target)
                    todo.append(target)
    assert offenders == []


def forbidden_imports(graph: dict[str, set[str]]) -> list[str]:
    """Every `module -> target` where the module's package may not import the target's (FORBIDDEN)."""
    return sorted(f"{m} -> {t}" for m, targets in graph.items() for t in targets
                  if t.split(".")[0] in FORBIDDEN.get(m.split(".")[0], frozenset()))


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_package_imports_none_of_its_forbidden_packages(package: str) -> None:
    graph = product_graph()
    assert _under(graph, package), f"no modules found under {package}/"
    assert [f for f in forbidden_imports(graph) if f.split(".")[0] == package] == []


def test_no_import_cycle_between_product_modules() -> None:
    graph = product_graph()
    assert cycles(graph, graph) == []


def test_dashboard_reads_only_the_api_and_the_bare_package() -> None:
    # the dashboard's data comes through the REST API, typed by fleetprof/ (report, api_models): no server or agent code
    graph = product_graph()
    found = sorted(f"{m} -> {t}" for m in _under(graph, "dashboard") for t in graph[m]
                   if t.split(".")[0] in ("server", "agent"))
    assert found == []


def test_the_checks_see_a_cycle_and_a_lazy_import(tmp_path: Path) -> None:
    # the reader itself: a cycle made by an import inside a function is found, a one-way import is not
    pkg = tmp_path / "server" / "analysis"
    pkg.mkdir(parents=True)
    for top in PRODUCT:
        (tmp_path / top).mkdir(exist_ok=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from server.analysis.b import f\n")
    (pkg / "b.py").write_text("def f():\n    from . import a\n")
    (pkg / "c.py").write_text("from server.analysis import a\nimport sqlalchemy\n")
    (tmp_path / "fleetprof" / "client.py").write_text("def f():\n    from server.analysis import c\n")
    (tmp_path / "dashboard" / "page.py").write_text("from fleetprof import client\n")
    graph = import_graph(tmp_path)
    assert cycles(graph, _under(graph, "server.analysis")) == [["server.analysis.a", "server.analysis.b"]]
    assert "sqlalchemy" in graph["server.analysis.c"]
    assert forbidden_imports(graph) == ["fleetprof.client -> server.analysis.c"]


def test_the_package_graph_sees_a_cycle_no_two_modules_make(tmp_path: Path) -> None:
    # server.x.a -> server.y.b and server.y.c -> server.x.d: no module cycle, a cycle between server.x and server.y
    for top in PRODUCT:
        (tmp_path / top).mkdir()
    for path, text in {"x/a.py": "import server.y.b\n", "x/d.py": "", "y/b.py": "", "y/c.py": "from server.x import d\n"}.items():
        (tmp_path / "server" / path).parent.mkdir(exist_ok=True)
        (tmp_path / "server" / path).write_text(text)
    graph = import_graph(tmp_path)
    assert cycles(graph, graph) == []
    packages = package_graph(graph, "server")
    assert cycles(packages, packages) == [["server.x", "server.y"]]


def test_the_package_view_sees_a_cycle_between_subpackages(tmp_path: Path) -> None:
    # modules that form no cycle among themselves can still tie their subpackages in a knot: x.a -> y.b -> x.c
    pkg = tmp_path / "server" / "analysis"
    for top in PRODUCT:
        (tmp_path / top).mkdir(exist_ok=True)
    for sub in ("x", "y", "z"):
        (pkg / sub).mkdir(parents=True)
        (pkg / sub / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "x" / "a.py").write_text("from server.analysis.y import b\n")
    (pkg / "y" / "b.py").write_text("from server.analysis.x.c import f\n")
    (pkg / "x" / "c.py").write_text("def f():\n    pass\n")
    (pkg / "z" / "d.py").write_text("from server.analysis.x import c\n")
    (pkg / "top.py").write_text("from server.analysis.z import d\n")
    graph = import_graph(tmp_path)
    assert cycles(graph, _under(graph, "server.analysis")) == []
    folded = package_graph(graph, "server.analysis")
    assert folded["server.analysis.top"] == {"server.analysis.z"}
    assert cycles(folded, folded) == [["server.analysis.x", "server.analysis.y"]]
