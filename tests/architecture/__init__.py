"""Tests of architecture (see tests/__init__.py)."""
