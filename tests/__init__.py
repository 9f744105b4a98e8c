"""dasc's tests, one folder per part of the source tree.

``compile/`` (dasc_compile: plans, references, TP placement), ``kernels/`` (templates/ and the
rendered Triton kernels), ``runtime/`` (runtime/ = dasc_runtime, the SGLang plugin), ``eval/``
(dasc_compile.eval), ``cli/`` (the CLI's bad-input corpus), ``benchmarks/`` (the benchmark
scripts' own logic, on CPU), ``architecture/`` (import rules across the tree). Shared helpers
live in one package, :mod:`tests.support`, imported by that name (the repository root is on
``sys.path``: ``pythonpath = ["."]`` in pyproject.toml).
"""
