"""No import circles in ``chorus/``: a module that two others both need lives below them, so the
package reads in one direction. Every import counts, at module level or inside a function (a
lazy import only hides a circle from Python, not from a reader), ``TYPE_CHECKING`` ones too."""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# Circles left for the server's restructuring (the service and its HTTP and WebSocket doors).
# This list only shrinks: an entry whose circle is gone fails test_every_allowed_circle_still_exists,
# and a new circle, or a module joining one of these, fails test_chorus_has_no_import_circle.
ALLOWED_CIRCLES = {
    frozenset({"chorus.server.service", "chorus.server.speech"}),
    frozenset({"chorus.server.ws_agent", "chorus.server.ws_turn"}),
}


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


def test_chorus_has_no_import_circle():
    new = import_circles(import_graph(ROOT)) - ALLOWED_CIRCLES
    assert not new, f"import circles (move what both modules need into a module below them): {_show(new)}"


def test_every_allowed_circle_still_exists():
    gone = ALLOWED_CIRCLES - import_circles(import_graph(ROOT))
    assert not gone, f"these circles are gone; remove them from ALLOWED_CIRCLES: {_show(gone)}"


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
