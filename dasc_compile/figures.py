"""What every ``--plot`` shares: the PNG file name check and a headless pyplot (matplotlib is imported only
when a figure is drawn, so the CLI stays quick)."""

from __future__ import annotations

from pathlib import Path

from dasc_compile.errors import DascInputError


def check_png(path: str | Path) -> Path:
    """``path`` as a Path.

    Raises:
        DascInputError: it does not end in ``.png`` (``--plot`` writes a PNG image), or it is an existing file
            that is not a PNG image (:func:`dasc_compile.userfiles.refuse_foreign_output`).
    """
    from dasc_compile.userfiles import refuse_foreign_output

    path = Path(path)
    if path.suffix.lower() != ".png":
        raise DascInputError(f"{path}: --plot writes a PNG image; give a file name ending in .png")
    refuse_foreign_output(path, "PNG image")
    return path


def pyplot():
    """``matplotlib.pyplot`` on the non-interactive Agg backend (no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt
