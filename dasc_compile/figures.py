"""What every ``--plot`` shares: the PNG file name check, a headless pyplot (matplotlib is imported only
when a figure is drawn, so the CLI stays quick), and the writer that marks each PNG as dasc's.

A ``--plot`` replaces only a PNG that a dasc command wrote: :func:`save_png` puts a ``tEXt`` chunk with the
keyword :data:`PNG_KEY` in every figure, and :func:`check_png` refuses an existing PNG without it (a photo,
a figure of another tool) before any work is done.
"""

from __future__ import annotations

import os
from pathlib import Path

from dasc_compile.errors import DascInputError


def check_png(path: str | Path) -> Path:
    """``path`` as a Path.

    Raises:
        DascInputError: it does not end in ``.png`` (``--plot`` writes a PNG image), or it is an existing file
            that is not a PNG image dasc wrote (:func:`dasc_compile.userfiles.refuse_foreign_output`), or its folder
            is missing or cannot be written (:func:`dasc_compile.userfiles.check_output_folder`).
    """
    from dasc_compile.userfiles import check_output_folder, refuse_foreign_output

    path = Path(path)
    if path.name in ("", ".", "..") or path.name.lower() == ".png":
        raise DascInputError(f"--plot {str(path)!r}: give a file name ending in .png, such as plan.png")
    if path.suffix.lower() != ".png":
        raise DascInputError(f"{path}: --plot writes a PNG image; give a file name ending in .png")
    refuse_foreign_output(path, "PNG image")
    check_output_folder(path)
    try:
        ours = path.stat().st_size == 0 or PNG_KEY in png_text_keys(path)
    except OSError:             # missing or unreadable: the write reports its own errors
        ours = True
    if not ours:
        raise DascInputError(f"{path}: exists and is a PNG image no dasc command wrote; dasc would overwrite it: "
                             f"give another path or remove the file first")
    return path


#: Keyword of the PNG ``tEXt`` chunk that marks a figure written by dasc (:func:`save_png`).
PNG_KEY = "dasc"


def png_text_keys(path: str | Path) -> set[str]:
    """The keywords of the PNG file ``path``'s text chunks that come before its image data (where matplotlib
    writes them), read by Pillow (matplotlib's own dependency) without decoding the image; an empty set for a
    file that is not a PNG or is cut short.

    Raises:
        OSError: the file cannot be opened or read.
    """
    from PIL import Image, UnidentifiedImageError

    if not os.path.isfile(path):
        raise FileNotFoundError(2, "No such file", str(path))
    try:
        with Image.open(path, formats=["PNG"]) as im:
            return {k for k, v in im.info.items() if isinstance(v, str)}
    except (UnidentifiedImageError, SyntaxError, ValueError, EOFError):
        return set()


def save_png(fig, out: str | Path, dpi: int, label: str | None = None) -> None:
    """Write ``fig`` to ``out`` as a PNG marked as dasc's (:data:`PNG_KEY`), atomically (a temporary file
    beside it, then a rename), and close the figure.

    Raises:
        DascInputError: ``label`` (default ``out``) and the system's reason when the file cannot be written.
    """
    import tempfile

    from dasc_compile.cli_exit import note_written

    plt = pyplot()
    out = Path(out)
    tmp = None
    try:        # a short temporary name: a 255-byte file name leaves no room for one built from it
        fd, tmp = tempfile.mkstemp(prefix=".dasc-", suffix=".png.tmp", dir=out.parent)
        os.close(fd)
        fig.savefig(tmp, format="png", dpi=dpi, metadata={PNG_KEY: "figure written by a dasc command"})
        os.chmod(tmp, 0o644)
        os.replace(tmp, out)
        note_written(out)        # a later stdout failure or Ctrl-C names it as written (cli_exit)
    except OSError as exc:
        raise DascInputError(f"{label or out}: cannot write the plot ({exc.strerror or type(exc).__name__})") from None
    finally:
        plt.close(fig)
        if tmp is not None and os.path.exists(tmp):
            os.unlink(tmp)


#: The range a quality metric can take (``None``: unbounded on that side), so that a mean ± SD band stays in it:
#: KL >= 0, agreement and retrieval accuracy in [0, 1]; ΔNLL has no bound.
METRIC_RANGE = {"kl": (0.0, None), "kl_head": (0.0, None), "gen_agreement": (0.0, 1.0), "agreement": (0.0, 1.0),
                "retrieval_acc_far": (0.0, 1.0), "retrieval_acc": (0.0, 1.0)}


def sd_band(metric: str, mean: list[float], sd: list[float]) -> tuple[list[float], list[float]]:
    """The lower and upper edges of a mean ± SD band for ``metric``, clipped to :data:`METRIC_RANGE` (a Random band of
    KL drawn below 0 showed values no mask can give)."""
    lo, hi = METRIC_RANGE.get(metric, (None, None))
    low = [a - b if lo is None else max(lo, a - b) for a, b in zip(mean, sd)]
    high = [a + b if hi is None else min(hi, a + b) for a, b in zip(mean, sd)]
    return low, high


def pyplot():
    """``matplotlib.pyplot`` on the non-interactive Agg backend (no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt
