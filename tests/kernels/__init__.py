"""Tests of kernels (see tests/__init__.py)."""
