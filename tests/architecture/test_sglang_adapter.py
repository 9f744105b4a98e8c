"""An SGLang version difference lives in one adapter (issue 21): ``runtime/sglang_api.py`` picks one adapter
module per tested release (``runtime/sglang_0517.py``, ``runtime/sglang_0523.py``); on the test side,
``tests/support/sglang_steps.py`` takes the scheduler's steps per release. Nothing else in the tree
branches on the SGLang version. These checks read source only (no SGLang needed).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ADAPTERS = {ROOT / "runtime" / "sglang_api.py", ROOT / "runtime" / "sglang_0517.py", ROOT / "runtime" / "sglang_0523.py",
            ROOT / "tests" / "support" / "sglang_steps.py",
            ROOT / "tests" / "runtime" / "test_sglang_versions.py"}     # the tests of the selection itself
VERSION_LITERAL = re.compile(r"^\d+\.\d+\.\d+")
#: names whose presence tells one release from another: probing them (hasattr / getattr) is a version check
RENAMED = {"kv", "prefix_indices", "copy_mamba_state", "copy_from", "_create_unified_radix_cache",
           "create_unified_radix_cache", "checkpoint", "on_release", "cache_finished_req", "cache_unfinished_req",
           "_select_finished_checkpoint", "enable_mamba_extra_buffer", "set_extend_range", "evict_for_alloc",
           "_apply_eviction_result", "kv_index_translator", "weight_update_runners", "mamba_prev_track_seqlen"}


def _sources() -> list[Path]:
    files = [p for d in ("runtime", "dasc_compile", "benchmarks", "tests", "templates", "plans", "scripts")
             for p in (ROOT / d).rglob("*.py")]
    files += [ROOT / "cli.py"]
    return sorted(p for p in files if p.exists() and ".venv" not in p.parts and p != Path(__file__).resolve())


def _version_checks(path: Path) -> list[str]:
    """``file:line: what`` for every place in ``path`` that tells SGLang releases apart."""
    tree = ast.parse(path.read_text(), filename=str(path))
    out = []

    def is_version(node) -> bool:
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and VERSION_LITERAL.match(node.value):
            return True
        if isinstance(node, ast.Attribute) and node.attr == "VERSION":
            return True
        if isinstance(node, ast.Attribute) and node.attr == "__version__" and "sglang" in ast.unparse(node.value):
            return True
        return False

    for node in ast.walk(tree):
        where = f"{path.relative_to(ROOT)}:{getattr(node, 'lineno', '?')}"
        if isinstance(node, ast.Compare) and any(is_version(n) for n in [node.left, *node.comparators]):
            out.append(f"{where}: compares a version")
        elif isinstance(node, ast.Attribute) and node.attr == "__version__" and "sglang" in ast.unparse(node.value) or (
                isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "getattr"
                and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant)
                and node.args[1].value == "__version__" and "sglang" in ast.unparse(node.args[0])):
            out.append(f"{where}: reads sglang's __version__")
        elif isinstance(node, ast.Dict) and any(k is not None and is_version(k) for k in node.keys):
            out.append(f"{where}: a table keyed by release")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "version" \
                and any(isinstance(a, ast.Constant) and a.value == "sglang" for a in node.args):
            out.append(f"{where}: reads the sglang distribution's version")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("hasattr", "getattr") \
                and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant) and node.args[1].value in RENAMED:
            out.append(f"{where}: probes {node.args[1].value!r}, which one release has and another not")
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names = [a.name for a in node.names] + ([node.module] if isinstance(node, ast.ImportFrom) and node.module
                                                    else [])
            if any(re.search(r"sglang_05\d\d", n or "") for n in names):
                out.append(f"{where}: imports a release's adapter directly")
    return out


def test_no_version_check_outside_the_adapters():
    files = _sources()
    assert len(files) > 100
    bad = [line for f in files if f not in ADAPTERS for line in _version_checks(f)]
    assert not bad, "SGLang version checks outside the adapter modules:\n" + "\n".join(bad)


def test_the_checker_finds_version_checks(tmp_path):
    probe = ROOT / "tests" / "_probe_version_check.py"
    probe.write_text("import sglang\nfrom dasc_runtime import sglang_0523\n"
                     "if sglang.__version__ == '0.5.23':\n    pass\n"
                     "x = hasattr(req, 'kv')\n")
    try:
        found = _version_checks(probe)
    finally:
        probe.unlink()
    assert any("compares a version" in f for f in found) and any("imports a release's adapter" in f for f in found)
    assert any("probes 'kv'" in f for f in found) and any("reads sglang's __version__" in f for f in found)
    # the adapters themselves are where the releases are told apart
    assert _version_checks(ROOT / "runtime" / "sglang_api.py")


def _public(path: Path) -> set[str]:
    """Module-level names an adapter defines (functions and UPPER_CASE constants, no leading underscore)."""
    out = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.FunctionDef) and not node.name.startswith("_"):
            out.add(node.name)
        elif isinstance(node, ast.Assign):
            out |= {t.id for t in node.targets if isinstance(t, ast.Name) and t.id.isupper() and not t.id.startswith("_")}
    return out


def test_each_release_adapter_speaks_the_same_names():
    a, b = (_public(ROOT / "runtime" / f"sglang_{v}.py") for v in ("0517", "0523"))
    assert a == b, f"only in 0.5.17's adapter: {sorted(a - b)}; only in 0.5.23's: {sorted(b - a)}"
    assert {"VERSION", "CACHE_FACTORY_TARGET", "ENGINE_KWARGS_TARGET", "WEIGHT_UPDATE_METHODS", "mamba_state",
            "server_option", "finished_checkpoint", "stand_in_inputs"} <= a


def test_adapters_import_sglang_only_inside_functions():
    """Importing an adapter (``dasc size``, ``plugin.register``) must not import SGLang."""
    for name in ("sglang_api", "sglang_0517", "sglang_0523"):
        top = [n for n in ast.parse((ROOT / "runtime" / f"{name}.py").read_text()).body
               if isinstance(n, (ast.Import, ast.ImportFrom))]
        mods = [getattr(n, "module", None) or n.names[0].name for n in top]
        assert not [m for m in mods if m and m.split(".")[0] == "sglang"], (name, mods)
