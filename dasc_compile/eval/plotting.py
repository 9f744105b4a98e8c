"""Quality against ``w_max`` for dasc-nr and dasc-wr with the count-matched Random band (paper Fig. 4h)."""

from __future__ import annotations

from pathlib import Path

from dasc_compile.errors import DascInputError
from dasc_compile.provenance import figure_label, figure_line, provenance_kind

_PANELS = (("retrieval_acc", "retrieval accuracy"), ("nll_delta", "suffix NLL - dense (nats/token)"),
           ("agreement", "greedy agreement with dense"))


def provenance_line(note: str) -> str:
    """The footer of the quality figure: where the model's decay values came from
    (:func:`dasc_compile.provenance.figure_line`; generated values get their label in capitals, the note is
    left to ``dasc inspect``)."""
    line = figure_line(note, width=140)
    if figure_label(note) is not None:
        line = f"{line.upper()} (dasc inspect shows the provenance note)"
    return line.replace("$", r"\$")   # keep matplotlib from reading '$...$' as mathtext


def plot_quality(result: dict, out: str | Path) -> None:
    """Write a PNG: one panel per metric, x = plan ``w_max`` (log2), lines for nr and wr, dense as a
    dashed line, Random mean +- SD as a band, and the model's provenance line (:func:`provenance_line`)
    under the panels. ``result`` is the ``dasc eval`` JSON document.

    Raises:
        DascInputError: ``out`` does not end in ``.png`` or cannot be written.
    """
    out = Path(out)
    if out.suffix.lower() != ".png":
        raise DascInputError(f"{out}: --plot writes a PNG image; give a file name ending in .png")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = sorted(result["plans"], key=lambda r: r["plan"]["w_max"])
    xs = [r["plan"]["w_max"] for r in rows]
    fig, axes = plt.subplots(1, len(_PANELS), figsize=(4.2 * len(_PANELS), 3.4))
    for ax, (metric, label) in zip(axes, _PANELS):
        for arm, style in (("nr", "o-"), ("wr", "s-")):
            ys = [r["arms"].get(arm, {}).get(metric) for r in rows]
            if any(y is not None for y in ys):
                ax.plot(xs, [float("nan") if y is None else y for y in ys], style, label=f"dasc-{arm}")
        if all("random" in r["arms"] for r in rows):
            m = [r["arms"]["random"][metric]["mean"] for r in rows]
            s = [r["arms"]["random"][metric]["sd"] for r in rows]
            if all(v is not None for v in m + s):
                ax.plot(xs, m, "x--", color="gray", label="Random (mean)")
                ax.fill_between(xs, [a - b for a, b in zip(m, s)], [a + b for a, b in zip(m, s)],
                                color="gray", alpha=0.25, label="Random ±SD")
        dense = rows[0]["arms"].get("dense", {}).get(metric) if rows else None
        if dense is not None:
            ax.axhline(dense, color="black", ls=":", lw=1, label="dense")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("w_max (tokens)")
        ax.set_title(label, fontsize=9)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    model = result.get("model", {})
    fig.suptitle(f"dasc eval: {model.get('path', '')} ({model.get('family', '')}, "
                 f"{result['protocol']['n_prompts']} prompts)", fontsize=9)
    fig.supxlabel(provenance_line(model.get("provenance", "")), fontsize=8,
                  color="black" if provenance_kind(model.get("provenance", "")) == "trained" else "crimson")
    fig.tight_layout()
    try:
        fig.savefig(out, dpi=120)
    except OSError as exc:
        raise DascInputError(f"{out}: cannot write the plot ({exc.strerror})") from None
    finally:
        plt.close(fig)
