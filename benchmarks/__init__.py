"""dasc benchmark scripts, run from the repository root as ``python -m benchmarks.<name>``.

They import the installed dasc packages (``dasc_compile``, ``dasc_runtime``); the results and their
narratives live in ``benchmarks/results/`` and ``benchmarks/notes/``, the table of claims in BENCHMARKS.md.
"""
