"""Tests of compile (see tests/__init__.py)."""
