"""The packed checkpoints a training call carries and returns (benchmarks/train/prepare.py ``stage``): each
family's parts ``FAM.tzp.NN`` (benchmarks/train/pack.py) found, checked by unpacking and read for the size they
were trained at; ``latest/``, where each family's newest parts are kept between calls; and what a call will
return (files and bytes against the 8 files / 64 MiB a device call gives back).
"""

from __future__ import annotations

import json
import math
import shutil
import tarfile
import tempfile
from pathlib import Path

from benchmarks.train import pack
from benchmarks.train.models import FAMILIES

__all__ = ["GROWTH", "LOG_BYTES", "PACKED_MIB", "PACKED_MIB_NO_ATTENTION", "RETURN_FILES", "RETURN_LIMIT",
           "StageError", "fresh_packed_mib", "parts_in", "return_estimate", "returned_parts", "size_of", "update_latest"]

RETURN_LIMIT, RETURN_FILES = 64 * 2 ** 20, 8    # what one device call returns (files of <= 16 MiB: pack.PART_BYTES)
LOG_BYTES = 2 ** 20                # run.log + summary.json (~40 KB in the calls of 2026-12-03)
GROWTH = 1.02                      # a trained checkpoint's parts vs the carried (or measured) ones: ref gdn 0.996
# Packed checkpoint with its training state (train.py --pack-to after 2 CPU steps, transformers 5.24, the
# 8,192-id tokenizer), MiB: what a fresh start returns. Trained ref gdn returned 14.54 (2026-12-03).
PACKED_MIB = {("gdn", "ref"): 14.60, ("kda", "ref"): 15.69, ("mamba2", "ref"): 15.89,
              ("gdn", "m30"): 42.83, ("kda", "m30"): 40.48, ("mamba2", "m30"): 42.23,
              ("gdn", "pilot"): 2.53, ("kda", "pilot"): 4.03, ("mamba2", "pilot"): 4.06,
              ("gdn", "smoke"): 0.61, ("kda", "smoke"): 0.96, ("mamba2", "smoke"): 0.98}
# The same sizes built with train.py --no-attention (every mixer recurrent), measured the same way (session 31):
# larger, as attention's projections give way to a recurrent mixer's; mamba2 m30 needs 4 parts, not 3.
PACKED_MIB_NO_ATTENTION = {("gdn", "ref"): 15.35, ("kda", "ref"): 16.01, ("mamba2", "ref"): 18.51,
                           ("gdn", "m30"): 46.14, ("kda", "m30"): 41.65, ("mamba2", "m30"): 49.97}


def fresh_packed_mib(fam: str, size: str) -> float:
    """What a fresh start of ``fam`` at ``size`` returns packed, MiB: the larger of the hybrid's and its
    recurrent-only twin's (:data:`PACKED_MIB`, :data:`PACKED_MIB_NO_ATTENTION`), as ``stage`` does not see
    the flags the call trains with."""
    return max(PACKED_MIB[fam, size], PACKED_MIB_NO_ATTENTION.get((fam, size), 0.0))


class StageError(ValueError):
    """Bad input to ``stage``: one line naming the flag or file and what was expected; nothing written."""


def size_of(parts: list[Path], where: str) -> str | None:
    """Unpack ``parts`` into a scratch folder (a damaged or missing part fails here, not on the device); the
    ``size`` its ``train_state/state.json`` records (``ref`` where it names none), None without a state."""
    try:
        with tempfile.TemporaryDirectory() as tmp:
            state = pack.unpack(parts, Path(tmp)) / "train_state" / "state.json"
            return json.loads(state.read_text()).get("size", "ref") if state.is_file() else None
    except (ValueError, OSError, tarfile.TarError) as exc:
        raise StageError(f"{where}: {exc}; nothing was staged") from None


def returned_parts(returned: Path | None) -> tuple[dict[str, list[Path]], dict[str, str | None]]:
    """Each family's packed parts in ``returned`` and the size each records, checked by unpacking them
    (:func:`size_of`)."""
    if returned is None:
        return {}, {}
    if not returned.is_dir():
        raise StageError(f"--returned {returned}: not a folder (give the folder holding the last call's "
                         f"<family>.tzp.* files)")
    parts = {fam: parts_in(returned, fam, "--returned") for fam in FAMILIES}
    parts = {fam: ps for fam, ps in parts.items() if ps}
    if not parts:
        raise StageError(f"--returned {returned}: no <family>.tzp.NN part in it (give the folder holding the last "
                         f"call's files, or leave --returned out); nothing was staged")
    return parts, {fam: size_of(ps, f"--returned {returned}") for fam, ps in parts.items()}


def parts_in(folder: Path, fam: str, what: str) -> list[Path]:
    """``fam``'s parts ``FAM.tzp.NN`` in ``folder``, in order. A file that starts like one but is not
    (``gdn.tzp.00.orig``) would travel and be unpacked as a part: refused, naming it."""
    found, odd = pack.parts_of(folder, fam)
    if odd:
        raise StageError(f"{what} {folder}: {', '.join(q.name for q in odd)} is not a part ({fam}.tzp.NN); move it "
                         f"away (nothing was staged)")
    return found


def return_estimate(packed: dict[str, int]) -> tuple[int, int]:
    """(files, bytes) a call returns when it trains the families of ``packed`` (family: bytes of its packed
    checkpoint, the carried one or :func:`fresh_packed_mib`'s): run.log, summary.json and each family's parts of at
    most ``pack.PART_BYTES``, each grown by :data:`GROWTH`."""
    grown = [math.ceil(b * GROWTH) for b in packed.values()]
    return 2 + sum(-(-g // pack.PART_BYTES) for g in grown), LOG_BYTES + sum(grown)


def update_latest(latest: Path, returned: dict[str, list[Path]]) -> None:
    """Keep each family's newest packed checkpoint in ``latest/`` (the call folder's sibling): the parts of
    ``returned`` (checked by :func:`returned_parts`) replace that family's there."""
    latest.mkdir(parents=True, exist_ok=True)
    for fam, parts in returned.items():
        if all(q.resolve().parent == latest.resolve() for q in parts):
            continue                 # --returned is latest/ itself: its parts are already the newest
        for old in parts_in(latest, fam, "latest"):
            old.unlink()
        for q in parts:
            shutil.copy2(q, latest / q.name)
