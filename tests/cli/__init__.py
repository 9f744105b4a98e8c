"""Tests of cli (see tests/__init__.py)."""
