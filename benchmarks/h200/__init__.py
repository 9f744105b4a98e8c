"""Drivers and recipes specific to the H200 device machines (README.md says how a device call is built)."""
