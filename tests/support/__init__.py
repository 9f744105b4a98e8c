"""Helpers shared by the tests (tiny checkpoints, the simulated SGLang scheduler, subprocess probes).

Imported as ``tests.support.<module>``; the probes run as ``python -m tests.support.<module>`` from the
repository root."""
