"""Tests of runtime (see tests/__init__.py)."""
