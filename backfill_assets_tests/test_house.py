"""The house's rules, held so that the commit that breaks one fails (`make check`): no module
of the package over 450 lines, no function over 80, no circle of imports (an import inside a
function counted), and no test module importing another (what tests share is in support/).
The layers and the engines' independence are import-linter's contracts (pyproject.toml)."""

from __future__ import annotations

import ast
from pathlib import Path

import grimp

from backfill_assets_tests.support.specs import REPO

PACKAGE = REPO / "backfill_assets"
TESTS = REPO / "backfill_assets_tests"
MAX_MODULE_LINES = 450
MAX_FUNCTION_LINES = 80


def _modules(root: Path) -> list[Path]:
    return sorted(root.rglob("*.py"))


def test_no_module_of_the_package_is_over_450_lines():
    over = {str(p.relative_to(REPO)): n for p in _modules(PACKAGE)
            if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_MODULE_LINES}
    assert not over, f"split these by role (at most {MAX_MODULE_LINES} lines): {over}"


def test_no_function_of_the_package_is_over_80_lines():
    over = {}
    for path in _modules(PACKAGE):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                if (n := node.end_lineno - node.lineno + 1) > MAX_FUNCTION_LINES:
                    over[f"{path.relative_to(REPO)}:{node.name}"] = n
    assert not over, f"at most {MAX_FUNCTION_LINES} lines a function: {over}"


def _circles(graph: grimp.ImportGraph) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(root: str) -> None:
        work = [(root, iter(sorted(graph.find_modules_directly_imported_by(root))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            module, edges = work[-1]
            for nxt in edges:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph.find_modules_directly_imported_by(nxt)))))
                    break
                if nxt in on_stack:
                    low[module] = min(low[module], index[nxt])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[module])
                if low[module] == index[module]:
                    group = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        group.append(member)
                        if member == module:
                            break
                    if len(group) > 1:
                        found.append(sorted(group))

    for module in sorted(graph.modules):
        if module not in index:
            visit(module)
    return found


def test_no_modules_of_the_package_import_each_other_in_a_circle():
    graph = grimp.build_graph("backfill_assets")  # every import statement, those inside functions too
    assert not _circles(graph), "move the shared piece down (a lazy import that dodges a circle is one)"


def test_the_circle_finder_finds_a_circle():
    graph = grimp.ImportGraph()
    for a, b in [("p.a", "p.b"), ("p.b", "p.c"), ("p.c", "p.a"), ("p.c", "p.d")]:
        graph.add_import(importer=a, imported=b)
    assert _circles(graph) == [["p.a", "p.b", "p.c"]]


def test_no_test_module_imports_another_test_module():
    found = []
    for path in _modules(TESTS):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = ([node.module or ""] if isinstance(node, ast.ImportFrom)
                     else [a.name for a in node.names] if isinstance(node, ast.Import) else [])
            found += [f"{path.relative_to(REPO)} imports {n}" for n in names
                      if n.startswith("backfill_assets_tests") and n.rsplit(".", 1)[-1].startswith("test_")]
    assert not found, "what tests share belongs in backfill_assets_tests/support/: " + "; ".join(found)
