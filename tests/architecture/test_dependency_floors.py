"""pyproject's dependency floors and scripts/floors.txt, the pins the lowest environment installs, say the same;
so do pyproject's Python range, the one scripts/setup_env.sh checks and the releases .ci/run builds on.

Dependencies are ranges tested at both ends: scripts/setup_env.sh installs scripts/floors.txt into the lowest
environment (README's test command runs the whole suite there) and the newest releases into the newest one. A
floor raised or lowered in one file and not the other would leave the range's lower end untested, so every
runtime dependency's ``>=`` bound must have its ``==`` line in floors.txt, and floors.txt nothing else (torch
included: the lowest environment installs torch 2.9.1 with torchvision 0.24.1, its matching release).
"""

from __future__ import annotations

from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]


def _floors_of_pyproject() -> dict[str, str]:
    """Each runtime dependency's name -> the version of its ``>=`` bound ("" when it has none)."""
    import tomllib                               # Python >= 3.11's standard library (pyproject's floor)

    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    out = {}
    for line in deps:
        req = Requirement(line)
        lows = [s.version for s in req.specifier if s.operator == ">="]
        out[canonicalize_name(req.name)] = lows[0] if len(lows) == 1 else ""
    return out


def _pins_of_floors_txt() -> dict[str, str]:
    """Each ``name==version`` line of scripts/floors.txt (comments and blank lines skipped) as name -> version."""
    out = {}
    for raw in (ROOT / "scripts" / "floors.txt").read_text().splitlines():
        line = raw.split("#", 1)[0].strip()
        if line:
            req = Requirement(line)
            (spec,) = req.specifier
            assert spec.operator == "==", f"scripts/floors.txt: {raw!r} is no 'name==version' pin"
            out[canonicalize_name(req.name)] = spec.version
    return out


def test_every_floor_is_pinned_in_floors_txt_and_nothing_else():
    floors, pins = _floors_of_pyproject(), _pins_of_floors_txt()
    unbounded = sorted(name for name, low in floors.items() if not low)
    assert not unbounded, f"pyproject dependencies without one '>=' floor: {unbounded}"
    differ = {name: (floors.get(name), pins.get(name)) for name in sorted(floors.keys() | pins.keys())
              if floors.get(name) != pins.get(name)}
    assert not differ, ("scripts/floors.txt and pyproject's floors differ (name: (pyproject, floors.txt)): "
                        f"{differ}; raise or lower a floor in both files")


def _python_range() -> tuple[tuple[int, int], tuple[int, int]]:
    """pyproject's ``requires-python`` as ``((3, lowest minor), (3, first minor not admitted))``."""
    import tomllib

    spec = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["requires-python"]
    bounds = {s.operator: tuple(int(x) for x in s.version.split(".")) for s in Requirement(f"python{spec}").specifier}
    assert set(bounds) == {">=", "<"}, f"requires-python {spec!r}: expected '>=3.A,<3.B'"
    return bounds[">="], bounds["<"]


def test_python_range_is_the_one_setup_env_checks_and_ci_tests_at_both_ends():
    """Python is a range tested at both ends, as the other dependencies: scripts/setup_env.sh refuses an interpreter
    outside pyproject's requires-python, CI (.ci/run) builds the lowest environment on the lowest admitted release and
    the newest on the highest. A bound moved in one file and not the others would
    admit an untested release or test one not admitted."""
    (lo_major, lo_minor), (hi_major, hi_minor) = _python_range()
    setup = (ROOT / "scripts" / "setup_env.sh").read_text()
    check = f"({lo_major}, {lo_minor}) <= sys.version_info[:2] < ({hi_major}, {hi_minor})"
    assert check in setup, f"scripts/setup_env.sh does not check {check!r} (pyproject's requires-python)"
    assert f"Python >= {lo_major}.{lo_minor}, < {hi_major}.{hi_minor}" in setup, "setup_env.sh's refusal names " \
        "another range than pyproject's requires-python"
    ci = (ROOT / ".ci" / "run").read_text()
    for var, want in (("PY_LOWEST", f"{lo_major}.{lo_minor}"), ("PY_NEWEST", f"{hi_major}.{hi_minor - 1}")):
        assert f"\n{var}={want}\n" in ci, \
            f".ci/run does not set {var}={want} (the {'lowest' if var == 'PY_LOWEST' else 'highest'} release " \
            f"requires-python admits), or sets it more than once"
        assert ci.count(f"{var}=") == 1, f".ci/run sets {var} more than once"
    for found, var, venv in (("LOWEST_PY", "PY_LOWEST", ".venv "), ("NEWEST_PY", "PY_NEWEST", ".venv-newest ")):
        assert f"{found}=$(find_python ${var})" in ci and f"PYTHON=${{{found}:-python3}} bash scripts/setup_env.sh " \
            f"{venv}" in ci, f".ci/run does not build {venv.strip()} on the Python {var} names"
