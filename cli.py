#!/usr/bin/env python3
"""Run the dasc CLI from a checkout: ``python cli.py compile ...`` (same as the installed ``dasc``)."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

# In a checkout (not installed) the folders runtime/, templates/, plans/ are importable only under
# their folder names; alias them to the installed names (dasc_runtime, dasc_templates, dasc_plans).
import importlib  # noqa: E402

for _alias, _folder in (("dasc_runtime", "runtime"), ("dasc_templates", "templates"), ("dasc_plans", "plans")):
    try:
        importlib.import_module(_alias)
    except ImportError:
        sys.modules[_alias] = importlib.import_module(_folder)

from dasc_compile.cli import main  # noqa: E402

if __name__ == "__main__":
    main()
