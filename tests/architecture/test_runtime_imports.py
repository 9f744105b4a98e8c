"""The runtime imports only the plan contract from the compiler (DESIGN.md "Data flow"):
``dasc_compile.schema`` and its submodules (``dasc_compile.schema.units``, ...)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

RUNTIME = Path(__file__).resolve().parents[2] / "runtime"
SCHEMA = "dasc_compile.schema"


def _allowed(module: str) -> bool:
    return module == SCHEMA or module.startswith(SCHEMA + ".")


def _compiler_imports(path: Path) -> list[tuple[int, str]]:
    """(line, module) of every import of a ``dasc_compile`` module in ``path`` (any nesting level)."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names if a.name.split(".")[0] == "dasc_compile"]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module \
                and node.module.split(".")[0] == "dasc_compile":
            if node.module == "dasc_compile":       # from dasc_compile import x -> module dasc_compile.x
                out += [(node.lineno, f"dasc_compile.{a.name}") for a in node.names]
            else:
                out.append((node.lineno, node.module))
    return out


def test_runtime_imports_only_the_schema():
    files = sorted(RUNTIME.glob("*.py"))
    assert len(files) > 10
    bad = [f"{f.name}:{line}: {mod}" for f in files for line, mod in _compiler_imports(f) if not _allowed(mod)]
    assert not bad, "runtime modules import the compiler beyond dasc_compile.schema:\n" + "\n".join(bad)
    # the checker sees real imports (the pool imports DascInputError from the schema)
    seen = {m for _, m in _compiler_imports(RUNTIME / "pool.py")}
    assert seen and all(_allowed(m) for m in seen)
    assert _allowed("dasc_compile.schema.units") and not _allowed("dasc_compile.schemata")
    assert not _allowed("dasc_compile.layout") and not _allowed("dasc_compile")


def _loaded_by(statement: str) -> set[str]:
    """The torch and dasc modules a fresh interpreter holds after running ``statement``."""
    code = (f"import sys\n{statement}\n"
            "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith(('dasc_compile', 'dasc_runtime'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    return set(ast.literal_eval(out))


def test_schema_module_stays_light_and_reexports_the_error():
    mods = _loaded_by("import dasc_compile.schema as s, dasc_compile.errors as e\n"
                      "assert s.DascInputError is e.DascInputError")
    assert "torch" not in mods
    assert {SCHEMA, "dasc_compile.schema.units", "dasc_compile.schema.reader"} <= mods
    # beyond its own submodules the schema pulls in only the policy model it embeds (and what that needs)
    policy = _loaded_by("import dasc_compile.policy")
    assert "torch" not in policy
    assert sorted(m for m in mods - policy if not _allowed(m)) == []
