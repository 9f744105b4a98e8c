"""Quality against ``w_max``: dasc-nr, dasc-wr, the controls and the count-matched Random band (paper Fig. 4h)."""

from __future__ import annotations

from pathlib import Path

from dasc_compile.console import counted
from dasc_compile.figures import sd_band
from dasc_compile.provenance import figure_label, figure_line, provenance_kind

PANELS = (("nll_delta_head", "NLL - dense, first 16 suffix tokens"), ("kl", "KL(dense || arm), whole suffix"),
           ("gen_agreement", "free-running greedy agreement"), ("retrieval_acc_far", "retrieval beyond w_max"))
# (arm, where it is read, style, label): the plan's own arms, the init-horizon control, the untrained model
_LINES = (("nr", "arms", "o-", "dasc-nr"), ("wr", "arms", "s-", "dasc-wr"), ("init", "arms", "^--", "init-horizon masks"),
          ("nr", "untrained", "v:", "untrained model, dasc-nr"))


def _num(v) -> float:
    return float("nan") if v is None else v


def provenance_line(note: str) -> str:
    """The footer of the quality figure: where the model's decay values came from
    (:func:`dasc_compile.provenance.figure_line`; generated values get their label in capitals, the note is
    left to ``dasc inspect``)."""
    line = figure_line(note, width=140)
    if figure_label(note) is not None:
        line = f"{line.upper()} (dasc inspect shows the provenance note)"
    return line.replace("$", r"\$")   # keep matplotlib from reading '$...$' as mathtext


def draw_panels(axes, result: dict, metrics=PANELS) -> None:
    """Draw one ``dasc eval`` document onto ``axes`` (one per entry of ``metrics``: ``(key, title)``):
    x = plan ``w_max`` (log2), lines for dasc-nr, dasc-wr, the init-horizon control and the untrained
    model (when measured), dense as a dotted line, Random mean +- SD as a band, plans compiled with
    ``--random-seed`` as separate markers."""
    every = sorted(result["plans"], key=lambda r: r["plan"]["w_max"])
    rows = [r for r in every if r["plan"].get("selection") != "random"]   # compiled Random plans are not dasc
    xs = [r["plan"]["w_max"] for r in rows]
    for ax, (metric, label) in zip(axes, metrics):
        measured = False
        for arm, where, style, name in _LINES:
            ys = [r.get(where, {}).get(arm, {}).get(metric) for r in rows]
            if any(y is not None for y in ys):
                ax.plot(xs, [_num(y) for y in ys], style, label=name)
                measured = True
        if not measured:        # e.g. free-running agreement on retrieval prompts only: say so, not a blank panel
            ax.text(0.5, 0.5, "not measured on these prompts", ha="center", va="center", transform=ax.transAxes,
                    fontsize=8, color="dimgray")
        rnd = [r for r in every if r["plan"].get("selection") == "random"]
        if rnd:
            ax.plot([r["plan"]["w_max"] for r in rnd], [_num(r["arms"].get("nr", {}).get(metric)) for r in rnd], "kx",
                    label="compiled Random plan")
        if rows and all("random" in r["arms"] for r in rows):
            m = [r["arms"]["random"][metric]["mean"] for r in rows]
            s = [r["arms"]["random"][metric]["sd"] for r in rows]
            if all(v is not None for v in m + s):
                ax.plot(xs, m, "x--", color="gray", label="Random (mean)")
                ax.fill_between(xs, *sd_band(metric, m, s), color="gray", alpha=0.25, label="Random ±SD")
        um = [(r.get("untrained", {}).get("random", {}).get(metric) or {}).get("mean") for r in rows]
        if any(v is not None for v in um):
            ax.plot(xs, [_num(v) for v in um], "+:", color="dimgray", label="untrained model, Random (mean)")
        dense = every[0]["arms"].get("dense", {}).get(metric) if every else None
        if dense is not None:
            ax.axhline(dense, color="black", ls=":", lw=1, label="dense")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("w_max (tokens)")
        ax.set_title(label, fontsize=9)
        ax.grid(alpha=0.3)


def save_figure(fig, out: str | Path, label: str) -> None:
    """Write ``fig`` to the PNG ``out`` at 120 dpi and close it (:func:`dasc_compile.figures.save_png`).

    Raises:
        DascInputError: ``label: cannot write the plot (reason)`` when the file cannot be written.
    """
    from dasc_compile.figures import save_png

    save_png(fig, out, 120, label)


def plot_quality(result: dict, out: str | Path) -> None:
    """Write a PNG: the panels of :func:`draw_panels` and the model's provenance line
    (:func:`provenance_line`) under them. ``result`` is the ``dasc eval`` JSON document.

    Raises:
        DascInputError: ``out`` does not end in ``.png`` or cannot be written.
    """
    from dasc_compile.figures import check_png, pyplot

    out = check_png(out)
    plt = pyplot()

    fig, axes = plt.subplots(1, len(PANELS), figsize=(4.2 * len(PANELS), 3.4))
    draw_panels(axes, result)
    axes[0].legend(fontsize=7)
    model = result.get("model", {})
    fig.suptitle(f"dasc eval: {model.get('path', '')} ({model.get('family', '')}, "
                 f"{counted(result['protocol']['n_prompts'], 'prompt')})", fontsize=9)
    fig.supxlabel(provenance_line(model.get("provenance", "")), fontsize=8,
                  color="black" if provenance_kind(model.get("provenance", "")) == "trained" else "crimson")
    fig.tight_layout()
    save_figure(fig, out, str(out))
