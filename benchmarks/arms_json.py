"""Reading back the arms.json of :mod:`benchmarks.serving_arms` (``--out``): the launch record of each arm, checked
before any server starts (``run_chat up``) or before a call's servers start (``run_chat run --check --arms-json``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from dasc_compile.errors import DascInputError


def arm_records(arms_json: Path) -> dict:
    """``{arm: launch record}`` of ``serving_arms``' arms.json: a non-empty list of objects, each with ``arm``,
    ``kind`` and a list of string ``flags``.

    Raises:
        DascInputError: naming the file (or the entry) and what was expected.
    """
    from benchmarks.serving_tables import read_json_file

    doc = read_json_file(arms_json, "arms.json (benchmarks.serving_arms --out)")
    if not isinstance(doc, list) or not doc:
        raise DascInputError(f"{arms_json}: expected a non-empty list of arms (benchmarks.serving_arms --out)")
    arms = {}
    for i, x in enumerate(doc):
        if not (isinstance(x, dict) and isinstance(x.get("arm"), str) and isinstance(x.get("kind"), str)
                and isinstance(x.get("flags"), list) and all(isinstance(f, str) for f in x["flags"])):
            raise DascInputError(f"{arms_json}: entry {i}: expected an object with 'arm', 'kind' and a list of "
                                 f"string 'flags'")
        arms[x["arm"]] = x
    return arms


def check_arm_names(names: Sequence[str], arms: dict, arms_json: Path) -> None:
    """Refuse arm names not among ``arms`` (:func:`arm_records` of ``arms_json``).

    Raises:
        DascInputError: naming the unknown arms, the file and the arms it has.
    """
    unknown = [n for n in names if n not in arms]
    if unknown:
        raise DascInputError(f"--arms {' '.join(unknown)}: not in {arms_json} ({', '.join(arms)})")


def read_arms(arms_json: Path, plans: Path, model: Path, names: Sequence[str] | None) -> tuple[dict, list[str]]:
    """``({arm: launch record}, the arms to start)`` from ``serving_arms``' arms.json, checked before anything is
    written or started: each entry an object with ``arm``, ``kind`` and a list of string ``flags``; ``names``
    (None: every arm) all in the file, none twice; every ``{plans}/NAME`` their flags name exists under ``plans``;
    ``model`` a folder with a ``config.json``.

    Raises:
        DascInputError: naming the file, entry or flag and what was expected (before session 19 a missing or
            broken arms.json was a traceback, and a missing model or plan folder was found only by the server).
    """
    arms = arm_records(arms_json)
    if not plans.is_dir():
        raise DascInputError(f"--plans {plans}: not a folder (the compiled plans that arms.json's {{plans}} names)")
    if not (model / "config.json").is_file():
        raise DascInputError(f"--model {model}: expected the served model's folder with a config.json")
    names = list(names or arms)
    if len(set(names)) != len(names):    # two servers for one arm: servers.json keeps one, and `down` misses the other
        raise DascInputError(f"--arms {' '.join(names)}: an arm named twice; expected each arm once")
    check_arm_names(names, arms, arms_json)
    for n in names:
        for f in arms[n]["flags"]:
            if "{plans}" in f and not Path(f.replace("{plans}", str(plans))).exists():
                raise DascInputError(f"{n}: its plan {f.replace('{plans}', str(plans))} does not exist "
                                     f"(arms.json names {f}; --plans {plans})")
    return arms, names
