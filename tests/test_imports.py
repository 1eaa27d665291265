"""No import circles in ``chorus/``: a module that two others both need lives below them, so the
package reads in one direction. Every import counts, at module level or inside a function (a
lazy import only hides a circle from Python, not from a reader), ``TYPE_CHECKING`` ones too."""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# The server's front doors: they import the service, never the other way round
# (a gRPC door joins them here)
DOORS = ("chorus.server.app", "chorus.server.http", "chorus.server.ws_agent", "chorus.server.ws_turn",
         "chorus.server.playground", "chorus.server.grpc")


def import_graph(root: Path, package: str = "chorus") -> dict[str, set[str]]:
    """Module name -> the modules of ``package`` (under ``root``) that it imports anywhere in its
    body. ``from a.b import c`` counts as importing ``a.b.c`` when that is a module, else ``a.b``."""
    files = {}
    for path in sorted((root / package).rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        name = ".".join(parts[:-1] if is_package else parts)
        files[name] = (path, is_package)
    graph: dict[str, set[str]] = {}
    for name, (path, is_package) in files.items():
        here = name.split(".") if is_package else name.split(".")[:-1]
        deps: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                deps.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = ".".join(here[:len(here) - node.level + 1] + ([node.module] if node.module else []))
                else:
                    base = node.module or ""
                deps.update(f"{base}.{alias.name}" if f"{base}.{alias.name}" in files else base
                            for alias in node.names)
        graph[name] = {dep for dep in deps if dep in files and dep != name}
    return graph


def import_circles(graph: dict[str, set[str]]) -> set[frozenset[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles: set[frozenset[str]] = set()

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for dep in sorted(graph[module]):
            if dep not in index:
                visit(dep)
                low[module] = min(low[module], low[dep])
            elif dep in on_stack:
                low[module] = min(low[module], index[dep])
        if low[module] == index[module]:
            component = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.add(member)
                if member == module:
                    break
            if len(component) > 1:
                circles.add(frozenset(component))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return circles


def _show(circles) -> str:
    return "; ".join(" <-> ".join(sorted(circle)) for circle in sorted(circles, key=sorted))


def door_leaks(graph: dict[str, set[str]], package: str = "chorus.server", doors=DOORS,
               root_module: str = "chorus.server.main") -> dict[str, list[str]]:
    """Each module of ``package`` but its doors and ``root_module`` (which puts doors and service
    together) -> the doors it imports, directly or through others; only modules that import one."""

    def is_door(module: str) -> bool:
        return any(module == door or module.startswith(door + ".") for door in doors)

    leaks = {}
    for module in graph:
        if not module.startswith(package + ".") or is_door(module) or module == root_module:
            continue
        seen, todo = set(), [module]
        while todo:
            for dep in graph[todo.pop()] - seen:
                seen.add(dep)
                todo.append(dep)
        if any(is_door(dep) for dep in seen):
            leaks[module] = sorted(dep for dep in seen if is_door(dep))
    return leaks


def test_chorus_has_no_import_circle():
    circles = import_circles(import_graph(ROOT))
    assert not circles, f"import circles (move what both modules need into a module below them): {_show(circles)}"


def test_the_server_service_imports_no_front_door():
    leaks = door_leaks(import_graph(ROOT))
    assert not leaks, f"service modules that import a front door (move the shared part below both): {leaks}"


def test_a_service_module_reaching_a_door_through_another_is_found():
    graph = {"srv.service": {"srv.helper"}, "srv.helper": {"srv.http.routes"}, "srv.http.routes": {"srv.service"},
             "srv.main": {"srv.http.routes"}, "srv.leaf": set()}
    assert door_leaks(graph, "srv", doors=("srv.http",), root_module="srv.main") == {
        "srv.service": ["srv.http.routes"], "srv.helper": ["srv.http.routes"]}


def test_a_circle_through_a_function_level_relative_import_is_found(tmp_path):
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "sub" / "__init__.py").write_text("")
    (package / "sub" / "a.py").write_text("from pkg.sub.b import helper\n")
    (package / "sub" / "b.py").write_text("def helper():\n    from . import c\n")
    (package / "sub" / "c.py").write_text("def late():\n    from ..sub.a import x\n")
    (package / "d.py").write_text("import pkg.sub.a\n")  # imports into the circle, is not part of it
    assert import_circles(import_graph(tmp_path, "pkg")) == {frozenset({"pkg.sub.a", "pkg.sub.b", "pkg.sub.c"})}
