"""Tests of benchmarks (see tests/__init__.py)."""
