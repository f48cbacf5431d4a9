"""Layering read from the source: `server.analysis` is pure and acyclic (modules and subpackages alike), `agent` runs
without `server`.

Imports are read with `ast`, so an import inside a function counts like one at the top: a lazy import that dodges
a cycle at run time is still a cycle in the design. `if TYPE_CHECKING:` imports count too.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Iterator
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
PRODUCT = ("fleetprof", "agent", "server", "dashboard")
# Pure analysis does no I/O: no database, web framework, HTTP client, broker or task queue.
IO_LIBRARIES = frozenset({"sqlalchemy", "fastapi", "starlette", "httpx", "redis", "celery", "psycopg2"})
# The one documented way from the node agent into the server: `fleetprof estimate --local` (ARCHITECTURE.md).
AGENT_INTO_SERVER_ALLOWED = ("agent.cli.estimate", "server.estimate")


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


def test_no_import_cycle_inside_analysis() -> None:
    graph = import_graph()
    assert cycles(graph, _under(graph, "server.analysis")) == []


def package_graph(graph: dict[str, set[str]], package: str) -> dict[str, set[str]]:
    """`graph` seen one level below `package`: each module counts as its subpackage (or itself, at the top)."""
    depth = package.count(".") + 2

    def node(module: str) -> str:
        return ".".join(module.split(".")[:depth])

    inside = _under(graph, package)
    folded: dict[str, set[str]] = {node(m): set() for m in inside if m != package}
    for module in inside:
        if module != package:
            folded[node(module)] |= {node(t) for t in graph[module] if t in inside and t != package}
    return {k: v - {k} for k, v in folded.items()}


def test_analysis_subpackages_form_no_cycle() -> None:
    # one concern per subpackage (memory, time, energy, planning, traces, fleet, base): a concern may use another
    # only one way round, or the split by concern means nothing
    graph = package_graph(import_graph(), "server.analysis")
    assert {"server.analysis.base", "server.analysis.planning", "server.analysis.traces"} <= graph.keys()
    assert cycles(graph, graph) == []
    assert graph["server.analysis.base"] == set()  # the shared base leans on no concern


def test_analysis_imports_no_io_even_indirectly() -> None:
    graph = import_graph()
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


def test_agent_imports_no_server_but_the_local_estimate() -> None:
    graph = import_graph()
    importer, allowed = AGENT_INTO_SERVER_ALLOWED
    found = sorted(f"{m} -> {t}" for m in _under(graph, "agent") for t in graph[m] if t.split(".")[0] == "server"
                   and not (m == importer and (t == allowed or t.startswith(allowed + "."))))
    assert found == []


def test_dashboard_reads_only_the_api_and_the_bare_package() -> None:
    # the dashboard's data comes through the REST API, typed by fleetprof/ (report, api_models): no server or agent code
    graph = import_graph()
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
    graph = import_graph(tmp_path)
    assert cycles(graph, _under(graph, "server.analysis")) == [["server.analysis.a", "server.analysis.b"]]
    assert "sqlalchemy" in graph["server.analysis.c"]


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
