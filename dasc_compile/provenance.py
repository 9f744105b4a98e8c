"""Where a plan's decay values came from: one kind per provenance note, and the label figures carry.

A checkpoint's safetensors metadata key ``dasc_provenance`` (:data:`dasc_compile.checkpoint.PROVENANCE_KEY`)
holds a free-text note that the compiler copies into ``plan.model.provenance``. The note's opening
words name its kind; this module is the one place that maps notes to kinds:

=================================  ===========================================================  ===========
kind                               note begins with                                             written by
=================================  ===========================================================  ===========
``initialisation-draw``            ``initialisation draw, not trained``                        :mod:`dasc_compile.refckpt`
``paper-calibrated``               ``synthetic, calibrated to published statistics; not ...``  :mod:`dasc_compile.calibrated`
``real-A_log+synthetic-dt_bias``   ``real A_log plus synthetic dt_bias``                        :mod:`dasc_compile.calibrated`
``trained``                        anything else (no ``dasc_provenance`` key: real weights)     -
=================================  ===========================================================  ===========

A note that says "not trained" or "initialisation draw" in another wording still counts as an
initialisation draw (older reference files), so a generated note is never taken for trained weights.
"""

from __future__ import annotations

import re

__all__ = ["CALIBRATED_PREFIX", "INIT_DRAW_PREFIX", "KINDS", "REAL_A_LOG_PREFIX", "figure_label",
           "figure_line", "provenance_kind", "short_line"]

INIT_DRAW_PREFIX = "initialisation draw, not trained"
CALIBRATED_PREFIX = "synthetic, calibrated to published statistics; not trained weights"
REAL_A_LOG_PREFIX = "real A_log plus synthetic dt_bias"

#: Every kind :func:`provenance_kind` returns.
KINDS = ("initialisation-draw", "paper-calibrated", "real-A_log+synthetic-dt_bias", "trained")

_INIT_DRAW = re.compile(r"not trained|initiali[sz]ation draw", re.IGNORECASE)


def provenance_kind(note: str) -> str:
    """The kind of a provenance note: one of :data:`KINDS` (table in the module docstring)."""
    if note.startswith(CALIBRATED_PREFIX):
        return "paper-calibrated"
    if note.startswith(REAL_A_LOG_PREFIX):
        return "real-A_log+synthetic-dt_bias"
    if _INIT_DRAW.search(note):
        return "initialisation-draw"
    return "trained"


def figure_label(note: str) -> str | None:
    """The line every figure of a plan must carry, or None for trained weights.

    ``paper-calibrated``: ``"synthetic, calibrated to published statistics; not trained weights"``;
    ``real-A_log+synthetic-dt_bias``: ``"real A_log plus synthetic dt_bias; not trained weights"``;
    ``initialisation-draw``: ``"initialisation draw, not trained weights"``.
    """
    kind = provenance_kind(note)
    return {"paper-calibrated": CALIBRATED_PREFIX,
            "real-A_log+synthetic-dt_bias": f"{REAL_A_LOG_PREFIX}; not trained weights",
            "initialisation-draw": "initialisation draw, not trained weights"}.get(kind)


def figure_line(note: str, width: int = 90) -> str:
    """The provenance line every figure carries, for every kind (trained included).

    Generated decay values: :func:`figure_label` followed by the note. Trained weights:
    ``"trained weights: <note>"`` (the note cut to ``width`` characters with ``...``), or just
    ``"trained weights"`` when the checkpoint carries no note, or the note alone when it already says "trained
    weights" (as ``dasc_compile.checkpoint.TRAINED_PROVENANCE`` does). ``figure_label`` itself stays None for
    trained weights: its callers use that to decide whether to warn that the values are not trained.
    """
    label = figure_label(note)
    if label is not None:
        return label
    short = " ".join(note.split())
    if len(short) > width:
        short = short[:width - 3].rstrip() + "..."
    if "trained weights" in short:          # e.g. "as read from checkpoint (trained weights)": said once
        return short
    return f"trained weights: {short}" if short else "trained weights"


def short_line(note: str) -> str:
    """The one short provenance line of every output but ``dasc inspect`` (which prints the whole note).

    ``"provenance: <figure_label> (dasc inspect shows the note)"`` for generated decay values, else
    ``"provenance: trained weights: <note cut to 80 characters>"`` (:func:`figure_line`): at most about
    110 characters whatever the note's length.
    """
    label = figure_label(note)
    return f"provenance: {label} (dasc inspect shows the note)" if label is not None else \
        f"provenance: {figure_line(note, width=80)}"
