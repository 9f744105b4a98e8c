#!/usr/bin/env python3
"""Run the dasc CLI from a checkout: ``python cli.py compile ...`` (same as the installed ``dasc``).

The package must be installed (``bash scripts/setup_env.sh .venv``, an editable install of this
checkout): ``dasc_runtime``, ``dasc_templates`` and ``dasc_plans`` exist only under their installed
names. Python puts this file's folder first on ``sys.path`` when it runs it, so ``dasc_compile`` is
this checkout's own.
"""

from dasc_compile.cli_exit import hold_signals

hold_signals()   # first: a Ctrl-C while typer and rich are imported ends as one line, not a traceback

import importlib.util  # noqa: E402
import sys  # noqa: E402

if importlib.util.find_spec("dasc_runtime") is None:
    print("error: dasc is not installed in this Python: run `bash scripts/setup_env.sh .venv` (or "
          "`pip install -e .`), then `.venv/bin/python cli.py ...`", file=sys.stderr)
    sys.exit(2)

from dasc_compile.cli import main  # noqa: E402

if __name__ == "__main__":
    main()
