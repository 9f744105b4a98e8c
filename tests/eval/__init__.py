"""Tests of eval (see tests/__init__.py)."""
