"""No import cycles among dasc's own modules (issue 12 item 2).

Every module of ``dasc_compile`` (``dasc_compile/``), ``dasc_runtime`` (``runtime/``) and
``dasc_templates`` (``templates/``) is parsed (AST, not imported), and every ``import`` it holds, at
any nesting level (inside functions and ``TYPE_CHECKING`` blocks too), is an edge to the dasc module it
names; ``from package import name`` is an edge to ``package.name`` when that is a module. Importing a
submodule's parent package is not an edge (Python runs the parent first, whatever the parent imports).
The test fails on any cycle and names its modules in order.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = {"dasc_compile": ROOT / "dasc_compile", "dasc_runtime": ROOT / "runtime", "dasc_templates": ROOT / "templates"}


def _modules() -> dict[str, Path]:
    """Installed module name -> source file, for every ``.py`` under the packages' folders."""
    out = {}
    for pkg, folder in PACKAGES.items():
        for path in sorted(folder.rglob("*.py")):
            rel = path.relative_to(folder).with_suffix("")
            parts = [pkg, *rel.parts]
            if parts[-1] == "__init__":
                parts.pop()
            if "__pycache__" not in parts:
                out[".".join(parts)] = path
    return out


def _edges(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    is_pkg = path.name == "__init__.py"
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        targets = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".") if is_pkg else name.split(".")[:-1]
                base = base[:len(base) - (node.level - 1)]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            targets = [f"{mod}.{a.name}" if f"{mod}.{a.name}" in modules else mod for a in node.names]
        for t in targets:
            while t and t not in modules and "." in t:    # `import a.b.c` of a non-module attribute path
                t = t.rsplit(".", 1)[0]
            if t in modules and t != name:
                out.add(t)
    return out


def import_graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _edges(name, path, modules) for name, path in modules.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle ``[a, b, ..., a]`` of ``graph``, or None (iterative depth-first search, sorted order)."""
    state: dict[str, int] = {}          # 1 = on the current path, 2 = done
    for start in sorted(graph):
        if state.get(start):
            continue
        path, stack = [start], [iter(sorted(graph[start]))]
        state[start] = 1
        while stack:
            nxt = next(stack[-1], None)
            if nxt is None:
                state[path.pop()] = 2
                stack.pop()
            elif state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            elif not state.get(nxt):
                state[nxt] = 1
                path.append(nxt)
                stack.append(iter(sorted(graph.get(nxt, ()))))
    return None


def test_the_checker_sees_imports_and_cycles():
    g = import_graph()
    assert len(g) > 40 and "dasc_compile.schema.units" in g and "dasc_runtime.plugin" in g
    assert "dasc_compile.schema.plan" in g["dasc_compile.schema"]               # from pkg.sub import ...
    assert "dasc_compile.archspec" in g["dasc_compile.families.base"]
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) is None


def test_no_import_cycles():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle)
