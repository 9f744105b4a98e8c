"""Which GPU a serving run ran on (issue 24): read it, name it, and keep two cards' runs apart.

rho is a fraction of one card's measured saturation, and a prefill weighs differently against decode on
each card, so a ratio never pairs, and a pool never averages, runs of two kinds of card. ``run_chat up``
records :func:`gpu_name` beside each server in ``servers.json``; :mod:`benchmarks.serving_report` checks the
runs with :func:`one_card` and writes the name into each arm object's ``gpu``; pooling and the regime map
label each series with :func:`card_label`. Summaries written before 2026-12-06 had the card added from their
run logs (session 40's note says how).
"""

from __future__ import annotations

import re
import subprocess
from typing import Sequence

from dasc_compile.errors import DascInputError

#: The series label of arm objects that record no card.
UNRECORDED = "card not recorded"


def gpu_name(index: int) -> str | None:
    """The name ``nvidia-smi`` gives GPU ``index`` (e.g. "NVIDIA H100 80GB HBM3"); None where nvidia-smi is
    absent or fails (a CPU rehearsal)."""
    try:
        p = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader", "-i", str(index)],
                           capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    lines = p.stdout.strip().splitlines() if p.returncode == 0 else []
    return (lines[0].strip() or None) if lines else None


def _squeeze(name: str | None) -> str:
    return re.sub(r"\s+", " ", name or "").strip()


def card_label(name: str | None) -> str:
    """A card's name as a label: the vendor prefix dropped, spaces collapsed, upper case ("NVIDIA H100 80GB HBM3"
    -> "H100 80GB HBM3", so an H100 PCIe, "H100 PCIE", stays apart from it). Upper case makes one series of a
    card whatever case a hand-typed ``--gpu-name`` used. :data:`UNRECORDED` for None or blank."""
    return re.sub(r"^NVIDIA ", "", _squeeze(name), flags=re.IGNORECASE).upper() or UNRECORDED


def add_gpu_name_option(ap) -> None:
    """The ``--gpu-name`` option of every command that reads work folders and checks their card (the
    ``given`` of :func:`one_card`)."""
    from benchmarks.cli_args import nonempty

    ap.add_argument("--gpu-name", type=nonempty("the card's name"), default=None,
                    help="the card the runs ran on, for work folders whose servers.json records none "
                         "(run_chat up records it from 2026-12-06), e.g. 'NVIDIA H100 80GB HBM3'")


def one_card(runs: Sequence[dict], given: str | None) -> str | None:
    """The one card every run ran on: each run's ``gpu`` (its manifest entry, else servers.json; ``work`` names
    its folder), and ``given`` for the runs whose folder records none; None where nothing names a card. Names
    compare as :func:`card_label`, ignoring case; a ``given`` that matches a recorded name returns the recorded
    spelling, any other ``given`` is returned with its spaces collapsed.

    Raises:
        DascInputError: a run's ``gpu`` is not a string; the runs record two cards; ``given`` names another
            card than the one recorded; or some runs record a card and others none while ``given`` is absent
            (each message names the folders).
    """
    bad = [r for r in runs if r.get("gpu") is not None and not isinstance(r["gpu"], str)]
    if bad:
        raise DascInputError(f"{bad[0].get('work', '?')}: a run's 'gpu' is {bad[0]['gpu']!r}: expected the card's "
                             f"name (a string) or null")
    recorded: dict = {}
    for r in runs:
        if r.get("gpu") and r["gpu"].strip():
            recorded.setdefault(card_label(r["gpu"]), r["gpu"])
    if len(recorded) > 1:
        names = ", ".join(map(repr, recorded.values()))
        raise DascInputError(f"the runs ran on {len(recorded)} kinds of card ({names}); a ratio pairs runs of one "
                             f"card: report each card's work folders apart")
    card = next(iter(recorded.values()), None)
    bare = sorted({str(r.get("work", "?")) for r in runs if not (r.get("gpu") or "").strip()})
    if given is not None:
        if card is not None and card_label(given) not in recorded:
            if bare:
                raise DascInputError(f"--gpu-name {given!r}: {', '.join(bare)} would then have run on another card "
                                     f"than the {card!r} the other folders record; report each card's folders apart")
            raise DascInputError(f"--gpu-name {given!r}: every work folder records its card ({card!r}); leave "
                                 f"--gpu-name out")
        return card if card is not None else _squeeze(given)
    if card is not None and bare:
        raise DascInputError(f"{', '.join(bare)}: records no card while the other folders record {card!r}; give "
                             f"--gpu-name with the card these ran on, or report them apart")
    return card
